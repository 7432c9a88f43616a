"""`batchtop serve --headless` as a process: graceful SIGINT / SIGTERM, exit codes, bad options."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from click.testing import CliRunner

from batchtop.core_engine.worker.model_runner import ModelRunner
from batchtop.core_engine.trace.trace import read_trace
from batchtop.tui.cli import main
from tests.conftest import fail_on_call

TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32"]


def start_server(*args: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}  # tiny tensors; the machine is shared
    proc = subprocess.Popen([sys.executable, "-m", "batchtop.tui", "serve", "--headless", *TINY, "--port", "0", *args],
                            stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stderr:
        found = re.search(r"on (http://\S+) ", line)
        if found:
            return proc, found.group(1)
    raise AssertionError(f"the server never said where it listens (exit {proc.wait()})")


def stream_events(url: str, body: dict, into: list[str]) -> threading.Thread:
    def read() -> None:
        with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=30) as response:
            into.extend(line for line in response.iter_lines() if line)

    thread = threading.Thread(target=read)
    thread.start()
    return thread


def wait_for_tokens(events: list[str]) -> None:
    deadline = time.monotonic() + 10
    while not events and time.monotonic() < deadline:
        time.sleep(0.01)
    assert events, "no token arrived"


def test_sigint_stops_accepting_ends_what_outlives_the_grace_writes_the_trace_and_exits_0(tmp_path):
    trace = tmp_path / "serve.jsonl.gz"
    proc, url = start_server("--record", str(trace), "--shutdown-grace", "0.5")
    events: list[str] = []
    reader = stream_events(url, {"prompt": [1, 2, 3], "max_tokens": 4000}, events)
    wait_for_tokens(events)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    reader.join(10)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert time.monotonic() - t0 < 5
    assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == 503 and events[-1] == "data: [DONE]"
    assert 1 < len(events) - 2 < 4000
    recorded = read_trace(str(trace))
    assert recorded.events[-1]["type"] == "end" and recorded.events[-1]["reason"] == "shutdown"
    assert any(e["type"] == "control" and e["name"] == "http" for e in recorded.events)
    assert any(e["type"] == "control" and e["name"] == "abort" for e in recorded.events)
    try:
        httpx.get(url + "/health", timeout=2)
        raise AssertionError("still listening")
    except httpx.ConnectError:
        pass


def test_sigterm_lets_a_request_in_flight_finish_then_exits_143():
    proc, url = start_server("--shutdown-grace", "10")
    events: list[str] = []
    reader = stream_events(url, {"prompt": [1, 2, 3], "max_tokens": 100}, events)
    wait_for_tokens(events)
    proc.send_signal(signal.SIGTERM)
    reader.join(20)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 143, err
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == 100
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and events[-1] == "data: [DONE]"


def test_an_engine_failure_exits_1(monkeypatch):
    monkeypatch.setattr(ModelRunner, "run", fail_on_call(ModelRunner.run, 5, "simulated device fault"))
    result = CliRunner().invoke(main, ["serve", "--headless", *TINY, "--port", "0", "--workload", "synthetic",
                                       "--num-requests", "4", "--rate", "0"])
    assert result.exit_code == 1
    assert "engine failure: RuntimeError: simulated device fault" in result.stderr


def test_a_taken_port_or_an_unknown_host_is_exit_2_naming_the_option():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["serve", "--headless", *TINY, "--port", str(port)])
    assert result.exit_code == 2 and f"--port: cannot listen on 127.0.0.1:{port}" in result.stderr
    result = CliRunner().invoke(main, ["serve", "--headless", *TINY, "--host", "no-such-host.invalid"])
    assert result.exit_code == 2 and "--host: cannot resolve 'no-such-host.invalid'" in result.stderr


@pytest.mark.parametrize("args, env, message", [
    (["--api-key", ""], {}, "the API key is empty; give a key clients send as `Authorization: Bearer KEY`"),
    (["--api-key", "  "], {}, "the API key is not printable ASCII without spaces"),
    ([], {"BATCHTOP_API_KEY": ""}, "Invalid value for '--api-key' (env var: 'BATCHTOP_API_KEY'): the API key is empty"),
    (["--shutdown-grace", "nan"], {}, "Invalid value for '--shutdown-grace': 'nan' is not a finite number"),
    (["--shutdown-grace", "inf"], {}, "Invalid value for '--shutdown-grace': 'inf' is not a finite number"),
    (["--shutdown-grace", "-1"], {}, "Invalid value for '--shutdown-grace': -1 must be >= 0"),
])
def test_a_key_that_would_turn_auth_off_or_a_grace_that_is_not_a_number_is_exit_2(args, env, message):
    result = CliRunner().invoke(main, ["serve", "--headless", *TINY, "--port", "0", *args], env=env)
    assert result.exit_code == 2, result.output
    assert message in result.stderr


@pytest.fixture
def hanging_template_model(tmp_path):
    model = tmp_path / "tiny-hf"
    assert CliRunner().invoke(main, ["export-checkpoint", str(model), "--model", "tiny"]).exit_code == 0
    config = model / "tokenizer_config.json"
    loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    config.write_text(json.dumps({**json.loads(config.read_text()), "chat_template": loops}))
    return model


def test_a_chat_template_that_never_ends_leaves_health_answering_and_sigterm_working(hanging_template_model):
    proc, url = start_server("--model", str(hanging_template_model), "--shutdown-grace", "1")
    answers: list[httpx.Response] = []
    chat = threading.Thread(target=lambda: answers.append(httpx.post(
        url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30)))
    chat.start()
    time.sleep(0.3)  # the render has begun
    assert httpx.get(url + "/health", timeout=5).status_code == 200
    rendering = chat.is_alive()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    chat.join(30)
    assert proc.returncode == 143, err
    assert rendering and answers and answers[0].status_code in (500, 503)
    assert answers[0].json()["error"]["code"] == answers[0].status_code


def test_a_chat_template_that_does_not_parse_is_exit_2_naming_its_file(tmp_path):
    model = tmp_path / "tiny-hf"
    assert CliRunner().invoke(main, ["export-checkpoint", str(model), "--model", "tiny"]).exit_code == 0
    (model / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }")
    result = CliRunner().invoke(main, ["serve", "--headless", "--model", str(model), "--device", "cpu", "--port", "0"])
    assert result.exit_code == 2, result.output
    assert f"{model / 'chat_template.jinja'}: the chat template does not parse: line 1: " in result.stderr
