"""The server's socket accepts connections from the moment `serve` prints its URL, before uvicorn runs."""

from __future__ import annotations

import socket

from batchtop.core_engine.serve.server import bind_socket


def test_a_client_that_connects_before_the_server_loop_runs_is_queued_not_refused():
    sock = bind_socket("127.0.0.1", 0)
    try:
        client = socket.create_connection(sock.getsockname()[:2], timeout=2)  # refused if only bound
        client.close()
    finally:
        sock.close()
