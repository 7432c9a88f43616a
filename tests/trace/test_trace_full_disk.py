"""A recording whose disk fills mid-run (issue 52, round 4, items 1-2): the run stops at that step with
its metrics written, marked incomplete, the error naming the trace (exit 1, no traceback); what the
trace holds reads back; the run loop closes its run and tells its listeners even when the trace
fails as it closes; a --record that cannot take even its header is refused before any work."""

from __future__ import annotations

import errno
import json

import pytest
from click.testing import CliRunner

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.run.headless import run_workload
from batchtop.core_engine.run.live_session import Session
from batchtop.core_engine.trace.trace import Recorder, read_trace
from batchtop.core_engine.trace.writer import TraceWriteError
from batchtop.tui.cli import main
from tests.conftest import make_requests, tiny_config
from tests.support.deadline import returns_within
from tests.support.exits import assert_exit_2
from tests.support.full_disk import fill_traces_after, small_tmpfs

TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32"]
RUN = ["--headless", *TINY, "--workload", "synthetic", "--output-mean", "16", "--time-scale", "0"]
ENOSPC = OSError(errno.ENOSPC, "No space left on device")


def headless(trace, metrics, num_requests: int = 200):
    return returns_within(600, lambda: CliRunner().invoke(  # a fresh session builds the C++ kernels first
        main, [*RUN, "--num-requests", str(num_requests), "--record", str(trace), "-o", str(metrics)]))


def assert_stopped_at_the_full_disk(result, trace, metrics) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    doc = json.loads(metrics.read_text())
    assert doc["complete"] is False
    assert f"cannot write the trace {trace}: No space left on device" in doc["error"]
    assert doc["steps"] > 0  # what ran before the disk filled is kept, the step it filled in too
    assert f"error: cannot write the trace {trace}" in result.output
    cut = read_trace(str(trace))  # what the trace holds reads back, with a warning, never an error
    assert cut.events and not cut.ended_cleanly
    assert any("did not close cleanly" in w or "truncated" in w for w in cut.warnings)


@pytest.mark.parametrize("name", ["run.jsonl", "run.jsonl.gz"])
def test_a_headless_run_whose_trace_fills_the_disk_writes_its_metrics_marked_incomplete(tmp_path, monkeypatch,
                                                                                         name):
    fill_traces_after(monkeypatch, 6000)
    trace, metrics = tmp_path / name, tmp_path / "m.json"
    result = headless(trace, metrics)
    assert_stopped_at_the_full_disk(result, trace, metrics)


def test_a_headless_run_recording_onto_a_full_tmpfs_writes_its_metrics_marked_incomplete(tmp_path):
    with small_tmpfs(tmp_path / "full") as mount:
        trace, metrics = mount / "t.jsonl", tmp_path / "m.json"
        result = headless(trace, metrics, num_requests=1500)
        assert_stopped_at_the_full_disk(result, trace, metrics)


def test_a_record_path_that_cannot_take_its_header_is_refused_before_the_run(tmp_path):
    result = CliRunner().invoke(main, [*RUN, "--num-requests", "2", "--record", "/dev/full",
                                       "-o", str(tmp_path / "m.json")])
    assert_exit_2(result, "--record", "/dev/full", "No space left on device")


class FailingRecorder(Recorder):
    """A trace whose every write fails from the first step on (its header was written)."""

    def record(self, snap, text=None) -> None:
        raise TraceWriteError(self.path, ENOSPC)

    def error(self, message: str) -> None:
        raise TraceWriteError(self.path, ENOSPC)

    def close(self, reason: str = "finished") -> None:
        raise TraceWriteError(self.path, ENOSPC)


class Listener:
    def __init__(self) -> None:
        self.closed_with: tuple[str, str | None] | None = None

    def observe(self, snap) -> None:
        pass

    def closed(self, reason: str, error: str | None) -> None:
        self.closed_with = (reason, error)


def test_a_trace_that_fails_again_as_the_run_closes_still_tells_the_listeners_and_ends_the_loop(tmp_path):
    engine = Engine(tiny_config())
    listener = Listener()
    session = Session(engine, [], recorder=FailingRecorder(str(tmp_path / "t.jsonl"), {}))
    session.listeners.append(listener)
    result = returns_within(30, lambda: run_workload(engine, make_requests(4), session))
    assert isinstance(result.error, TraceWriteError) and not result.complete
    assert listener.closed_with is not None and "cannot write the trace" in listener.closed_with[1]


def test_a_trace_that_fails_only_as_it_closes_marks_a_finished_run_failed(tmp_path):
    class FailsAtClose(Recorder):
        def close(self, reason: str = "finished") -> None:
            raise TraceWriteError(self.path, ENOSPC)

    engine = Engine(tiny_config())
    listener = Listener()
    session = Session(engine, [], recorder=FailsAtClose(str(tmp_path / "t.jsonl"), {}))
    session.listeners.append(listener)
    result = returns_within(30, lambda: run_workload(engine, make_requests(4), session))
    assert isinstance(result.error, TraceWriteError) and not result.complete
    assert listener.closed_with == ("finished", None)  # the run itself finished: the server saw a clean stop


def test_with_a_failure_policy_the_run_goes_on_unrecorded_and_is_told_once(tmp_path, monkeypatch):
    fill_traces_after(monkeypatch, 3000)
    told: list[TraceWriteError] = []
    engine = Engine(tiny_config())
    trace = tmp_path / "t.jsonl"
    session = Session(engine, [], recorder=Recorder(str(trace), {}), on_record_failure=told.append)
    requests = make_requests(40)
    result = returns_within(30, lambda: run_workload(engine, requests, session))
    assert result.error is None and result.complete
    assert result.collector.summary({}, complete=True)["requests"]["completed"] == len(requests)
    assert len(told) == 1 and str(trace) in str(told[0])
    assert session.recorder.failure is told[0] and "up to the write that failed" in session.recorder.outcome()
    assert read_trace(str(trace)).events
