"""A local HTTP server on 127.0.0.1 whose paths answer what a test sets (status, body), changeable
between requests: llama.cpp's /metrics beside its /slots, trtllm-serve's JSON, one answer per scrape."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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


@contextmanager
def route_server(routes: Routes) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            status, text = routes.answer(self.path)
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if text[:1] in "[{" else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
