"""`batchtop web`'s refusals: each exits 2 naming the option before anything is served, since a tab
whose command fails shows only a blank page, and a port taken by `batchtop serve` must say so."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner

from batchtop.tui.cli.main import main
from batchtop.tui.cli.web import is_loopback, tab_command, url_of


def web(*args: str):
    return CliRunner().invoke(main, ["web", *args])


def test_a_taken_port_exits_2_naming_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        result = web("--port", str(taken.getsockname()[1]))
    assert result.exit_code == 2
    assert "--port" in result.output and "in use" in result.output


def test_a_host_that_does_not_resolve_exits_2_naming_host():
    result = web("--host", "no-such-host.invalid", "--port", "0")
    assert result.exit_code == 2
    assert "--host" in result.output


@pytest.mark.parametrize("args, words", [
    (["--modle", "tiny"], "No such option '--modle'"),
    (["compare"], "opens no dashboard"),
    (["serve"], "-- attach URL"),
    (["web"], "opens no dashboard"),
    (["--headless"], "--headless opens no screen"),
    (["replay", "t.jsonl", "--headless"], "--headless opens no screen"),
    (["attach"], "Missing argument"),
    (["--help"], "opens no screen"),
])
def test_a_tab_command_that_would_fail_exits_2_naming_args(args, words):
    result = web("--port", "0", "--", *args)
    assert result.exit_code == 2, result.output
    assert "-- ARGS" in result.output and words in result.output


def test_the_help_sends_many_viewers_to_attach():
    text = " ".join(web("--help").output.split())
    assert "-- attach http://127.0.0.1:8000" in text and "batchtop serve" in text


def test_loopback_is_told_from_the_network():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.0.2.1")


def test_the_url_names_the_bound_port_and_a_reachable_address():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        assert url_of(sock, "127.0.0.1") == f"http://127.0.0.1:{port}/"
        assert url_of(sock, "0.0.0.0") == f"http://127.0.0.1:{port}/"
        assert url_of(sock, "::1") == f"http://[::1]:{port}/"


def test_a_tab_runs_this_interpreters_batchtop_with_the_args_quoted():
    command = tab_command(("replay", "my trace.jsonl"))
    assert "-m batchtop.tui replay 'my trace.jsonl'" in command


def test_the_web_server_loads_no_textual_of_its_own():
    """Only the tabs' processes draw: the server stays a small aiohttp process however many tabs open."""
    code = ("import sys, batchtop.tui.cli.main, batchtop.tui.cli.web, textual_serve.server\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'textual'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_a_host_off_loopback_is_served_with_a_warning(monkeypatch):
    """Bound on 127.0.0.1 (nothing here listens off loopback), told it is not: the warning names the risk."""
    import batchtop.tui.cli.web as web_module

    async def serve_nothing(server, sock) -> int:
        sock.close()
        return signal.SIGINT

    monkeypatch.setattr(web_module, "is_loopback", lambda host: False)
    monkeypatch.setattr(web_module, "_serve", serve_nothing)
    result = web("--host", "127.0.0.1", "--port", "0", "--", "--model", "tiny")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "is not loopback" in text and "runs `batchtop --model tiny` here" in text
    assert re.search(r"serving `batchtop --model tiny` to browsers at http://127\.0\.0\.1:\d+/", text)
