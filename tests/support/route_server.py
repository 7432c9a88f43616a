"""A local HTTP server on 127.0.0.1 whose paths answer what a test sets (status, body), changeable
between requests: llama.cpp's /metrics beside its /slots, trtllm-serve's JSON, one answer per scrape."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager

from tests.support.local_http import Answering, local_server


class Routes:
    def __init__(self, routes: dict[str, tuple[int, str]]) -> None:
        self.routes = dict(routes)  # path -> (status, body); a list value answers its items in turn
        self.queues: dict[str, list[tuple[int, str]]] = {}
        self.hits: dict[str, int] = {}
        self.lock = threading.Lock()

    def answer(self, path: str) -> tuple[int, str]:
        with self.lock:
            self.hits[path] = self.hits.get(path, 0) + 1
            queue = self.queues.get(path)
            if queue:
                self.routes[path] = queue.pop(0)
            return self.routes.get(path, (404, "not found"))


def route_server(routes: Routes) -> AbstractContextManager[str]:
    """The server's URL, as a context manager (tests/support/local_http.py)."""
    class Handler(Answering):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            status, text = routes.answer(self.path)
            self.answer(status, text.encode(), "application/json" if text[:1] in "[{" else "text/plain")

    return local_server(Handler)
