"""The attach dashboard (Pilot): a recording of three vLLM replicas and a dead one plays in the attach
panels with the numbers, the health, the imbalance line and what is measured vs derived; a live feed
over a local server fills the same panels."""

from __future__ import annotations

import asyncio

from batchtop.core_engine.attach.record.record import AttachRecorder, attach_header
from batchtop.core_engine.attach.scrape.scrape import DOWN, ScrapeResult
from batchtop.core_engine.perf.device_peaks import datasheet_peaks
from batchtop.core_engine.trace.trace import read_trace
from batchtop.tui.app import BatchtopApp
from batchtop.tui.sources.attach import AttachReplaySource, AttachSource
from batchtop.tui.cli.attach import AttachOptions, prepare
from batchtop.tui.widgets.attach.kv import AttachKVPanel
from batchtop.tui.widgets.attach.metrics_strip import AttachMetricsStrip, metrics_text
from batchtop.tui.widgets.attach.replicas import AttachReplicasPanel
from batchtop.tui.widgets.attach.roofline import AttachRooflinePanel
from batchtop.tui.widgets.attach.slots import AttachSlotsPanel
from batchtop.tui.widgets.attach.waiting import AttachWaitingPanel
from tests.support.attach_helpers import VLLM_IDLE, VLLM_T0, VLLM_T2, FlakyMetrics, flaky_server, live, vllm_sample

URLS = ["http://gpu-a:8000/metrics", "http://gpu-b:8000/metrics", "http://gpu-c:8000/metrics",
        "http://gpu-d:8000/metrics"]


def record_fleet(path: str) -> None:
    h100 = datasheet_peaks("H100")
    rec = AttachRecorder(path, attach_header(URLS, 2.0, 30.0, None, None, h100.as_dict()) | {"peaks_note": "h100"})
    down = ScrapeResult(DOWN, "[Errno 111] Connection refused", None, 0.001)
    for tick, (t, busy) in enumerate(((0.0, VLLM_T0), (2.0, VLLM_T2)), start=1):
        rec.tick(tick, t, [live(vllm_sample(busy, t)), live(vllm_sample(busy, t)),
                           live(vllm_sample(VLLM_IDLE, t)), down])
    rec.close(2.0)


async def wait_for(pilot, condition, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if condition():
            return
        await pilot.pause(0.05)
    raise AssertionError("timed out")


async def test_a_recorded_fleet_replays_in_the_attach_panels(tmp_path):
    path = str(tmp_path / "fleet.jsonl.gz")
    record_fleet(path)
    trace = read_trace(path)
    assert trace.header["source"] == "attach"
    source = AttachReplaySource(trace, speed=16.0)
    app = BatchtopApp(source)
    async with app.run_test(size=(150, 48)) as pilot:
        await wait_for(pilot, lambda: app.source.frame is not None and app.source.frame.tick == 2)
        await pilot.pause(0.2)
        replicas = app.query_one(AttachReplicasPanel).render().plain
        assert "DOWN" in replicas and "Connection refused" in replicas
        assert "imbalance: replica 2 (http://gpu-c:8000/metrics)" in replicas  # the idle one of three busy
        assert app.query_one(AttachReplicasPanel).border_title == "Replicas 3/4 live"
        slots = app.query_one(AttachSlotsPanel)
        assert slots.border_title.startswith("Slots: 16 running / ?")
        assert "give --max-num-seqs" in slots.render().plain
        kv = app.query_one(AttachKVPanel)
        assert "/24576 used" in kv.border_title and "no owners" in kv.border_title  # 3 x 8192 blocks
        waiting = app.query_one(AttachWaitingPanel).render().plain
        assert "capacity 96" in waiting and "slots likely full" in waiting
        roofline = app.query_one(AttachRooflinePanel)
        assert roofline.border_title == "Roofline (measured)" and "memory-bound" in roofline.render().plain
        strip = metrics_text(app.source.frame.main).plain
        assert f"gen {2 * (12241 - 6497) / 2:.0f} tok/s" in strip and "measured:" in strip
        assert str(app.query_one(AttachMetricsStrip).render()).startswith(" prompt")
        await pilot.press("space")
        assert source.paused
        await pilot.press("t")  # another theme repaints without error
        await pilot.press("q")


async def test_the_live_dashboard_fills_from_a_server(tmp_path):
    state = FlakyMetrics(VLLM_T0.read_text())
    with flaky_server(state) as url:
        setup = prepare((url,), AttachOptions(interval=0.3, device="h100", max_num_seqs=8,
                                              record=str(tmp_path / "live.jsonl")))
        app = BatchtopApp(AttachSource(setup))
        async with app.run_test(size=(140, 44)) as pilot:
            await wait_for(pilot, lambda: app.source.frame is not None and app.source.frame.tick >= 2)
            state.text = VLLM_T2.read_text()
            await wait_for(pilot, lambda: app.source.frame.main.waiting == 48)
            await pilot.pause(0.3)
            slots = app.query_one(AttachSlotsPanel)
            assert slots.border_title == "Slots: 8 running / 8 (measured)"
            assert "max_num_seqs from --max-num-seqs" in slots.border_subtitle
            # the newest scrape's reading, or, once enough scrapes have come in, the verdict's: both name the slots
            waiting = app.query_one(AttachWaitingPanel).render().plain
            assert "slots full" in waiting or "(the verdict: slots)" in waiting, waiting
            assert "live" in str(app.query_one("#status").render())
            await pilot.press("space")  # a live server cannot be paused: the key does nothing
            await pilot.press("q")
        await asyncio.sleep(0.3)
    trace = read_trace(str(tmp_path / "live.jsonl"))
    assert trace.ended_cleanly and any(e["type"] == "scrape" for e in trace.events)


def test_the_attach_command_opens_its_dashboard_on_a_live_feed(monkeypatch):
    """`batchtop attach URL` without --headless: the command builds the live app (its imports included)."""
    from click.testing import CliRunner

    from batchtop.tui.cli import main

    opened = []
    monkeypatch.setattr(BatchtopApp, "run", lambda self: opened.append(self.source) or 0)
    result = CliRunner().invoke(main, ["attach", "http://127.0.0.1:9", "--device", "h100"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert len(opened) == 1 and isinstance(opened[0], AttachSource) and opened[0].setup.urls == ["http://127.0.0.1:9/metrics"]
