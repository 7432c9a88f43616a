"""Signals (docs/headless.md, "Exit codes"): SIGTERM stops a run like Ctrl-C, at a step boundary, with what finished
measured and the trace closed; before a run either one exits with one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

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
    from batchtop.core_engine.run.live_session import Session
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


# -- issue 29 round 2: SIGTERM at any moment closes a dashboard recording --------------------------

DASHBOARD_RUN = ["--model", "tiny", "--device", "cpu", "--workload", "synthetic", "--num-requests", "3000",
                 "--rate", "20"]


def test_a_signal_before_the_dashboard_has_drawn_still_closes_its_recording(tmp_path, monkeypatch):
    """A SIGTERM raised while Textual starts (the recorder already open on the worker thread that built
    the engine, the app's own handler not yet installed) unwinds run_dashboard; the recording still
    gets its end event."""
    from batchtop.core_engine.run.stop import Terminated
    from batchtop.tui.app import BatchtopApp
    from batchtop.tui.cli.dashboard import run_dashboard
    from batchtop.tui.cli.options import engine_options, session_options

    def starting(self):  # the model is built and the recording open (the worker thread), then the signal
        import threading
        threading.Thread(target=self.source.run, args=(lambda: False,), daemon=True).start()
        wait_for_open = time.monotonic() + 60
        while (self.source.inner is None or not self.source.inner.started.is_set()) and time.monotonic() < wait_for_open:
            time.sleep(0.01)
        raise Terminated()

    monkeypatch.setattr(BatchtopApp, "run", starting)
    path = tmp_path / "k.jsonl.gz"
    import click

    @click.command()
    @engine_options
    @session_options
    def parse(**opts):
        return opts

    opts = parse.main(["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--workload", "synthetic",
                       "--num-requests", "3", "--record", str(path)], standalone_mode=False)
    try:
        run_dashboard(opts)
        raise AssertionError("run_dashboard returned")
    except Terminated:
        pass
    recorded = read_trace(str(path))
    assert recorded.events[-1]["type"] == "end" and recorded.events[-1]["reason"] == "interrupted"
    assert not recorded.warnings


def _dashboard_on_a_terminal(args: list[str]):
    """The dashboard in a child process on a pseudo-terminal (100x30), its screen drained in a thread."""
    import fcntl
    import pty
    import struct
    import termios
    import threading

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "batchtop.tui", *args], stdin=slave, stdout=slave, stderr=slave,
                            env={**ENV, "TERM": "xterm-256color"}, start_new_session=True)
    os.close(slave)
    screen = bytearray()

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            screen.extend(data)

    threading.Thread(target=drain, daemon=True).start()
    return proc, screen


def _wait_until(predicate, timeout: float = 120.0, step: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(step)
    raise AssertionError("timed out")


def test_sigterm_the_moment_a_dashboard_recording_opens_closes_it_and_exits_143(tmp_path):
    """The window the report found: SIGTERM after the recorder opened but before the app took SIGTERM
    (Textual starting up) left a gzip stream without its end (replay: 'did not close cleanly')."""
    path = tmp_path / "k.jsonl.gz"
    proc, screen = _dashboard_on_a_terminal([*DASHBOARD_RUN, "--record", str(path)])
    try:
        _wait_until(lambda: path.exists() and path.stat().st_size > 0)  # the header is written on open
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143, bytes(screen[-2000:])
    finally:
        if proc.poll() is None:
            proc.kill()
    recorded = read_trace(str(path))
    assert recorded.events and recorded.events[-1]["type"] == "end", recorded.warnings
    assert not recorded.warnings
    assert b"Traceback" not in screen


def test_sigterm_while_the_dashboard_builds_its_model_exits_143_with_one_line(tmp_path):
    """The build runs on its own thread: an interpreter shutting down around it aborted with
    'terminate called without an active exception' (exit 134)."""
    proc, screen = _dashboard_on_a_terminal(["--model", "cpu-demo", "--device", "cpu", "--num-requests", "2",
                                             "--record", str(tmp_path / "k.jsonl")])
    try:
        _wait_until(lambda: b"building cpu-demo" in screen)
        time.sleep(0.3)  # inside the build
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143, bytes(screen[-2000:])
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.2)
    text = bytes(screen).decode(errors="replace")
    assert "batchtop: stopped by SIGTERM" in text and "terminate called" not in text and "Traceback" not in text


# -- issue 29 round 2: a signal while Python imports the CLI (the first ~1.5 s) -----------------------

def _catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for signum installed (Linux: /proc/PID/status SigCgt)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(mask >> (signum - 1) & 1)


def _loading_torch(pid: int) -> bool:
    """Whether torch's library is mapped: `import torch` has begun (its Python half takes a second more)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "libtorch_cpu" in f.read()
    except OSError:
        return False


def _signal_while_importing(signum: int, *, ignore_sigint: bool = False) -> tuple[int, str]:
    """Start batchtop and send signum while torch and the engine are still being imported: as soon as
    its first handler is in (SIGTERM is caught by nothing else, so its bit says the entry module ran),
    or, where no handler comes that early, once torch has begun loading."""
    preexec = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
    proc = subprocess.Popen([sys.executable, "-m", "batchtop.tui", "--headless", "--model", "tiny", "--device", "cpu",
                             "--workload", "synthetic", "--num-requests", "2", "-o", os.devnull],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV, preexec_fn=preexec)
    deadline = time.monotonic() + 30
    while (not (_catches(proc.pid, signal.SIGTERM) or _loading_torch(proc.pid)) and time.monotonic() < deadline
           and proc.poll() is None):
        time.sleep(0.001)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_cli_is_imported_exits_with_one_line(signum):
    code, err = _signal_while_importing(signum)
    assert code == 128 + signum, err
    assert err == f"batchtop: stopped by {signal.Signals(signum).name}\n"  # no traceback, no run


def test_ctrl_c_while_importing_is_honoured_in_a_job_started_with_sigint_ignored():
    """A script's `cmd &` job starts with SIGINT ignored: the Ctrl-C sent during the imports was lost
    and the run went on to exit 0."""
    code, err = _signal_while_importing(signal.SIGINT, ignore_sigint=True)
    assert code == 130, err
    assert err == "batchtop: stopped by SIGINT\n"
