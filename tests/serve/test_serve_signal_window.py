"""Ctrl-C at the edges of `serve --headless` starting (issue 41, finding 14): from the moment it says
it serves, Ctrl-C is a clean stop, exit 0 (docs/serve.md, docs/reliability.md), and a signal while
uvicorn is still starting stops the server instead of leaving it running forever."""

from __future__ import annotations

import asyncio
import os
import signal
import socket

from click.testing import CliRunner

from batchtop.core_engine.serve import server as server_module
from batchtop.core_engine.serve.server import Server
from batchtop.tui.cli import main

TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32"]


class IdleHub:
    async def drain(self, grace_s: float) -> None:
        pass


def test_a_signal_before_uvicorn_has_a_listener_still_stops_the_server():
    """The drain closed uvicorn's listeners, which exist only once its start-up made them: a signal
    before that raised inside the drain task, and the server never stopped (the process hung)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        server = Server(lambda scope, receive, send: None, IdleHub(), sock, grace_s=0)
        assert not hasattr(server._uvicorn, "servers")  # uvicorn has not started
        asyncio.run(server._drain())
        assert server._uvicorn.should_exit


def test_ctrl_c_right_after_serve_says_it_serves_is_a_clean_stop(monkeypatch):
    """The note came before uvicorn took the signals: a Ctrl-C in between met the CLI's handler and
    exited 130 through a KeyboardInterrupt, mid-start."""
    run = Server.run

    def interrupted_at_once(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # handled before the next line runs
        run(self)

    monkeypatch.setattr(server_module.Server, "run", interrupted_at_once)
    result = CliRunner().invoke(main, ["serve", "--headless", *TINY, "--port", "0"])
    assert result.exit_code == 0, result.output
    assert "serving tiny on" in result.stderr and "stopped by SIGINT" not in result.stderr
