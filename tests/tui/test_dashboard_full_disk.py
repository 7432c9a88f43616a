"""The dashboard's recording onto a disk that fills (issue 52, round 4, item 2): the same close path as
--headless and serve, so the engine thread ends with the error naming the trace, says it once without a
traceback, and the screen stays up; quitting afterwards does not fail on the closed trace."""

from __future__ import annotations

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.run.live_session import Session
from batchtop.core_engine.trace.trace import Recorder, read_trace
from batchtop.tui.sources.live import EngineSource
from tests.conftest import make_requests, tiny_config
from tests.support.deadline import returns_within
from tests.support.full_disk import fill_traces_after


def test_a_dashboard_whose_trace_fills_the_disk_shows_the_error_and_stays_up(tmp_path, monkeypatch):
    fill_traces_after(monkeypatch, 4000)
    trace = tmp_path / "d.jsonl"
    engine = Engine(tiny_config())
    session = Session(engine, make_requests(40), recorder=Recorder(str(trace), {}))
    source = EngineSource(engine, session=session)
    told: list[tuple[str, str]] = []
    source.notify = lambda kind, text: told.append((kind, text))
    returns_within(60, lambda: source.run(lambda: False))  # the loop ends by itself: the error
    assert source.error is not None and f"cannot write the trace {trace}: No space left on device" in source.error
    assert source.frame.state == "error" and source.done.is_set()
    assert [kind for kind, _ in told] == ["error"] and "Traceback" not in told[0][1]
    source.shut_down("error", 1.0)  # q after the error: nothing left to close, nothing raised
    assert read_trace(str(trace)).events
