"""The attach panels over a real vLLM server's step log and KV events (the 0.32.0 capture, recorded as
`attach --record --vllm-log --kv-events` writes it, replayed): the Slots panel draws each logged step's
prefill and decode rows, the KV panel the server's prefix cache with its shared system prompt, the
Roofline panel a point per step, the strip the real step rate."""

from __future__ import annotations

from batchtop.core_engine.attach.record.record import AttachRecorder, attach_header
from batchtop.core_engine.attach.server_point import ModelEstimate
from batchtop.core_engine.config import PRESETS
from batchtop.core_engine.model.smollm2 import smollm2_file
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.trace.trace import read_trace
from batchtop.tui.app import BatchtopApp
from batchtop.tui.sources.attach import AttachReplaySource
from batchtop.tui.widgets.attach.kv import AttachKVPanel
from batchtop.tui.widgets.attach.metrics_strip import AttachMetricsStrip
from batchtop.tui.widgets.attach.roofline import AttachRooflinePanel
from batchtop.tui.widgets.attach.slots import AttachSlotsPanel
from tests.support.vllm_step_streams import URL, capture_ticks
from tests.tui.test_attach_app import wait_for

CPU = DevicePeaks("2-core CPU", 4e11, 4e10, "measured")


def record_capture(path: str, until_t: float) -> None:
    estimate = ModelEstimate(PRESETS["cpu-demo"], "bfloat16")
    streams = {"log": "-", "kv_events": "tcp://127.0.0.1:5557",
               "tokenizer": "smollm2" if smollm2_file() is not None else None}
    recorder = AttachRecorder(path, attach_header([URL], 1.0, 30.0, 8, estimate, CPU.as_dict(), streams)
                              | {"peaks_note": "measured"})
    ticks = [tick for tick in capture_ticks() if tick.t <= until_t]
    for i, tick in enumerate(ticks, start=1):
        recorder.tick(i, tick.t, tick.results, tick.streams)
    recorder.close(ticks[-1].t)


async def test_the_panels_draw_the_logged_steps_and_the_prefix_cache(tmp_path):
    path = str(tmp_path / "vllm-streams.jsonl.gz")
    record_capture(path, until_t=30.0)  # while the load runs
    source = AttachReplaySource(read_trace(path), speed=64.0)
    app = BatchtopApp(source)
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_for(pilot, lambda: source.position == len(source.ticks), timeout_s=20.0)
        await pilot.pause(0.3)
        slots = app.query_one(AttachSlotsPanel)
        text = slots.render().plain
        assert "steps logged" in slots.border_title
        assert "decode rows" in text and "prefill rows" in text and "steps/s" in text
        newest = source.frame.streams.steps.newest.step
        assert f"step {newest.iteration}: " in text
        kv = app.query_one(AttachKVPanel).render().plain
        assert "prefix cache:" in kv and "blocks cached" in kv and "shared prefixes, most reused first:" in kv
        if smollm2_file() is not None:
            assert "You are assistant number" in kv
        roof = app.query_one(AttachRooflinePanel)
        assert roof.border_title == "Roofline (step log)" and "step: " in roof.render().plain
        strip = str(app.query_one(AttachMetricsStrip).render())
        assert "steps/s (logged" in strip
