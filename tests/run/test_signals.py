"""Signals (docs/headless.md, "Exit codes"): SIGTERM stops a run like Ctrl-C, at a step boundary, with what finished
measured and the trace closed; before a run either one exits with one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from batchtop.core_engine.trace.trace import read_trace
from tests.tui.test_dashboard import TickClock, WORKLOAD, PEAKS, wait_for
from tests.conftest import tiny_config, wait_for_finishes

LONG_RUN = ["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--workload", "synthetic",
            "--num-requests", "20000", "--prompt-mean", "4", "--output-mean", "4"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def start(args: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "batchtop.tui", *args], stderr=subprocess.PIPE, text=True, env=ENV)
    for _ in range(5):  # building..., roofs: the run starts after these lines
        if "roofs:" in proc.stderr.readline():
            return proc
    raise AssertionError("the run did not start")


def test_sigterm_in_headless_writes_incomplete_metrics_closes_the_trace_and_exits_143(tmp_path):
    out, trace = tmp_path / "m.json", tmp_path / "t.jsonl"
    proc = start(["--headless", *LONG_RUN, "-o", str(out), "--record", str(trace)])
    wait_for_finishes(trace)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    m = json.loads(out.read_text())
    assert m["complete"] is False and m["error"] == "interrupted" and m["interrupted_by"] == "SIGTERM"
    assert 0 < m["requests"]["completed"] < 20000
    recorded = read_trace(str(trace))
    assert recorded.events[-1]["type"] == "end" and recorded.events[-1]["reason"] == "interrupted"
    assert not recorded.warnings  # closed cleanly: no truncated line
    assert "Traceback" not in err


def test_sigterm_in_compare_keeps_the_first_runs_metrics_and_exits_143(tmp_path):
    out = tmp_path / "c.json"
    proc = start(["compare", *LONG_RUN, "-o", str(out)])
    time.sleep(2.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    doc = json.loads(out.read_text())
    assert doc["speedup"] is None and doc["static"]["complete"] is False


def test_ctrl_c_while_the_model_is_built_exits_130_with_one_line():
    proc = subprocess.Popen([sys.executable, "-m", "batchtop.tui", "--headless", "--model", "cpu-demo",
                             "--device", "cpu", "--num-requests", "2"], stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=ENV)
    assert "building cpu-demo" in proc.stderr.readline()  # printed just before the (seconds-long) build
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "batchtop: stopped by SIGINT"
    assert "Aborted!" not in err and "Traceback" not in err and out == ""


async def test_sigterm_closes_the_dashboard_and_its_recording(tmp_path):
    from batchtop.core_engine.engine.engine import Engine
    from batchtop.core_engine.run.session import Session
    from batchtop.core_engine.trace.trace import Recorder
    from batchtop.tui.app import BatchtopApp
    from batchtop.tui.sources.live import EngineSource

    config = tiny_config(max_num_seqs=4)
    engine = Engine(config, clock=TickClock())
    path = str(tmp_path / "session.jsonl.gz")
    session = Session(engine, WORKLOAD, recorder=Recorder(path, {"config": config.as_dict()}))
    app = BatchtopApp(EngineSource(engine, WORKLOAD, start_paused=True, session=session, peaks=PEAKS))
    previous = signal.getsignal(signal.SIGTERM)

    def guard(*_) -> None:  # should the app not take SIGTERM, the test fails, not pytest
        pass

    signal.signal(signal.SIGTERM, guard)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("n")
            await wait_for(pilot, lambda: app.source.frame.snapshot is not None
                           and app.source.frame.snapshot.counters.steps == 1)
            os.kill(os.getpid(), signal.SIGTERM)
            await wait_for(pilot, lambda: app.return_value is not None)
        assert signal.getsignal(signal.SIGTERM) is guard  # closed, the app hands SIGTERM back (the CLI's)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert app.return_value == 143 and app.source.done.is_set()
    recorded = read_trace(path)
    assert recorded.events[-1]["type"] == "end" and not recorded.warnings
