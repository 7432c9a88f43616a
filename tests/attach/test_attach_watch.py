"""The one watch loop that `attach --headless` and the dashboard both drive: it stops at --duration or
when cancelled, and whatever ends it, the recording ends saying how."""

from __future__ import annotations

import pytest

from batchtop.core_engine.attach.setup import AttachOptions, AttachSetup
from batchtop.core_engine.attach.watch import AttachWatch
from batchtop.core_engine.trace.trace import read_trace
from tests.support.attach_helpers import VLLM_T0, FlakyMetrics, flaky_server


def setup_for(url: str, record: str, **opts) -> AttachSetup:
    return AttachSetup([url], AttachOptions(interval=0.1, record=record, **opts), None, None, "none")


def end_reason(path: str) -> str:
    trace = read_trace(path)
    assert trace.events[-1]["type"] == "end"
    return trace.events[-1]["reason"]


def test_it_stops_at_the_duration_with_every_tick_recorded(tmp_path):
    path = str(tmp_path / "rec.jsonl")
    frames = []
    with flaky_server(FlakyMetrics(VLLM_T0.read_text())) as url:
        watch = AttachWatch(setup_for(url, path, headless=True, duration=0.3))
        watch.run(frames.append)
    assert watch.complete and [f.tick for f in frames] == [1, 2, 3, 4]  # t = 0, 0.1, 0.2, 0.3
    assert watch.frame is frames[-1] and watch.frame.main.running == 8
    assert sum(e["type"] == "scrape" for e in read_trace(path).events) == 4
    assert end_reason(path) == "finished"


def test_a_cancelled_watch_ends_its_recording_as_finished(tmp_path):
    path = str(tmp_path / "rec.jsonl")
    frames = []
    with flaky_server(FlakyMetrics(VLLM_T0.read_text())) as url:
        watch = AttachWatch(setup_for(url, path))
        watch.run(frames.append, cancelled=lambda: len(frames) >= 2)
    assert not watch.complete and len(frames) == 2 and end_reason(path) == "finished"


@pytest.mark.parametrize("raised, reason", [(KeyboardInterrupt, "interrupted"), (RuntimeError, "error")])
def test_an_interrupted_or_broken_watch_says_so_in_its_recording(tmp_path, raised, reason):
    path = str(tmp_path / "rec.jsonl")

    def on_frame(frame):
        if frame.tick == 2:
            raise raised("stop")

    with flaky_server(FlakyMetrics(VLLM_T0.read_text())) as url:
        watch = AttachWatch(setup_for(url, path))
        with pytest.raises(raised):
            watch.run(on_frame)
    assert watch.frame.tick == 2 and end_reason(path) == reason
