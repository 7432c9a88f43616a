"""`serve --record` onto a disk that fills (issue 52, round 4, item 1): the recording stops with one
warning naming the trace and serving goes on (every completion answers, /health stays 200, a Ctrl-C
still exits 0); where no such policy is set, the engine's end reaches the server (500, /health 503,
the server stops): never a hang."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.trace.trace import Recorder, read_trace
from tests.conftest import tiny_config
from tests.support.full_disk import fill_traces_after, filling_command, filling_env, small_tmpfs
from tests.support.serving import serving

TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32"]
PROMPT = list(range(1, 41))


def serve_with(command: list[str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=filling_env())
    for line in proc.stderr:
        found = re.search(r"on (http://\S+) ", line)
        if found:
            return proc, found.group(1)
    raise AssertionError(f"the server never said where it listens (exit {proc.wait(30)})")


def assert_serves_on_after_the_disk_fills(proc: subprocess.Popen, url: str, trace: Path, num_requests: int) -> None:
    try:
        for i in range(num_requests):  # the disk fills within the first few
            response = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 24}, timeout=20)
            assert response.status_code == 200, (i, response.text)
            assert response.json()["choices"][0]["finish_reason"] == "length"
        assert httpx.get(url + "/health", timeout=5).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # a server that no longer stops: fail, and leave no process behind
            proc.kill()
            proc.communicate()
            raise
    assert proc.returncode == 0, err
    assert f"warning: cannot write the trace {trace}: No space left on device" in err
    assert "serving goes on unrecorded" in err and "Traceback" not in err
    assert err.count("cannot write the trace") == 1  # told once, not once a step
    cut = read_trace(str(trace))  # what it holds reads back, with a warning
    assert cut.events and not cut.ended_cleanly


def test_a_server_whose_trace_fills_the_disk_stops_recording_and_serves_on(tmp_path):
    trace = tmp_path / "s.jsonl"
    proc, url = serve_with(filling_command(12_000, "serve", "--headless", *TINY, "--port", "0",
                                           "--record", str(trace), "--record-text"))
    assert_serves_on_after_the_disk_fills(proc, url, trace, 8)  # it fills in the first


def test_a_server_recording_onto_a_full_tmpfs_serves_on(tmp_path):
    with small_tmpfs(tmp_path / "full", "64k") as mount:  # about 13 KB a request: full by the fifth
        trace = mount / "s.jsonl"
        proc, url = serve_with([sys.executable, "-m", "batchtop.tui", "serve", "--headless", *TINY, "--port", "0",
                                "--record", str(trace), "--record-text"])
        assert_serves_on_after_the_disk_fills(proc, url, trace, 12)


def test_without_a_policy_a_trace_that_fails_ends_the_engine_and_the_server_says_so(tmp_path, monkeypatch):
    fill_traces_after(monkeypatch, 2000)
    engine = Engine(tiny_config())
    trace = tmp_path / "s.jsonl"
    with serving(engine=engine, recorder=Recorder(str(trace), {}), stop_on_engine_failure=False) as server:
        response = server.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 200})
        assert response.status_code == 500 and str(trace) in response.json()["error"]["message"]
        health = server.get("/health")
        assert health.status_code == 503 and "cannot write the trace" in health.text
        assert server.post("/v1/completions", json={"prompt": [1], "max_tokens": 1}).status_code == 500
