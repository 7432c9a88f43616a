"""A local HTTP server for tests: a handler that answers one GET at a time, served on 127.0.0.1 at a
free port in a daemon thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Answering(BaseHTTPRequestHandler):
    """A handler whose do_GET calls `answer`; it logs nothing, and a client that hung up mid-answer
    (a scraper's timeout) is not an error."""

    def answer(self, status: int, body: bytes, content_type: str = "text/plain; version=0.0.4") -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args) -> None:
        pass


@contextmanager
def local_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Yields the server's base URL, http://127.0.0.1:PORT; shuts it down on exit."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
