"""The attach dashboard (Pilot) names what bounds the batch on its first line, with what to try, and
its panels say what each server cannot fill: TGI's missing KV gauge, llama.cpp's slots one by one."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from batchtop.core_engine.attach.record.record import AttachRecorder, attach_header
from batchtop.core_engine.attach.scrape.sample import Slot, parse_exposition
from batchtop.core_engine.trace.trace import read_trace
from batchtop.tui.app import BatchtopApp
from batchtop.tui.sources.attach import AttachReplaySource
from batchtop.tui.widgets.attach.kv import AttachKVPanel
from batchtop.tui.widgets.attach.metrics_strip import AttachMetricsStrip
from batchtop.tui.widgets.attach.slots import AttachSlotsPanel
from batchtop.tui.widgets.attach.verdict_line import AttachVerdictLine
from batchtop.tui.widgets.attach.waiting import AttachWaitingPanel
from tests.support.attach_helpers import DATA, live
from tests.support.scripted_vllm import ScriptedVllm, Tick

URL = "http://gpu:8000/metrics"


def record(path: str, samples) -> None:
    rec = AttachRecorder(path, attach_header([URL], 1.0, 30.0, None, None, None))
    for tick, sample in enumerate(samples, start=1):
        rec.tick(tick, sample.t, [live(sample)])
    rec.close(samples[-1].t)


async def run_to_end(pilot, app, ticks: int) -> None:
    for _ in range(400):
        if app.source.frame is not None and app.source.frame.tick == ticks:
            break
        await pilot.pause(0.05)
    await pilot.pause(0.3)


async def test_the_first_line_names_the_bound_and_what_to_try(tmp_path):
    server = ScriptedVllm()
    samples = [parse_exposition(server.text(Tick(4, 28, kv=0.12, steps=(4,) * 40, finished=((64, 256),))), float(i))
               for i in range(14)]
    path = str(tmp_path / "slots.jsonl")
    record(path, samples)
    app = BatchtopApp(AttachReplaySource(read_trace(path), speed=64.0))
    async with app.run_test(size=(160, 46)) as pilot:
        await run_to_end(pilot, app, 14)
        line = str(app.query_one(AttachVerdictLine).render())
        assert line.startswith(" SLOTS  slots: running at the ceiling of 4, inferred from the plateau")
        assert "\n try: raise --max-num-seqs above 4: KV has room (12%)" in line
        slots = app.query_one(AttachSlotsPanel)
        assert slots.border_title == "Slots: 4 running / 4 (measured)"
        assert slots.border_subtitle == "max_num_seqs inferred from the plateau"
        assert "(ceiling inferred)" in slots.render().plain
        assert "the queue waits for a free slot (the verdict: slots)" in app.query_one(AttachWaitingPanel).render().plain
        await pilot.press("q")


async def test_tgi_panels_say_what_tgi_does_not_expose(tmp_path):
    samples = [parse_exposition((DATA / name).read_text(), t) for name, t in (("tgi-3.3-a.prom", 0.0),
                                                                              ("tgi-3.3-b.prom", 2.0))]
    path = str(tmp_path / "tgi.jsonl")
    record(path, samples)
    app = BatchtopApp(AttachReplaySource(read_trace(path), speed=64.0))
    async with app.run_test(size=(160, 46)) as pilot:
        await run_to_end(pilot, app, 2)
        assert "TGI exposes no KV usage" in app.query_one(AttachKVPanel).render().plain
        assert "TGI does not export max_batch_size" in app.query_one(AttachSlotsPanel).render().plain
        waiting = app.query_one(AttachWaitingPanel).render().plain
        assert "TGI gives no waiting reasons" in waiting and "TGI exposes no preemption counter" in waiting
        strip = str(app.query_one(AttachMetricsStrip).render())
        assert "TGI has no token counters" in strip and "TGI exposes no TTFT histogram" in strip
        assert " TGI · gpu:8000 " in app.query_one("#status").render().plain
        await pilot.press("q")


async def test_llamacpp_slots_are_drawn_one_by_one(tmp_path):
    base = parse_exposition((DATA / "llamacpp-a.prom").read_text(), 0.0)
    slots = (Slot(0, True, 4096, 120), Slot(1, False, 4096, 0), Slot(2, True, 4096, 40))
    samples = [dataclasses.replace(base, t=float(t), slots=slots, max_num_seqs=3, ceiling_from="/slots") for t in (0, 1)]
    path = str(tmp_path / "llama.jsonl")
    record(path, samples)
    app = BatchtopApp(AttachReplaySource(read_trace(path), speed=64.0))
    async with app.run_test(size=(160, 46)) as pilot:
        await run_to_end(pilot, app, 2)
        panel = app.query_one(AttachSlotsPanel)
        text = panel.render().plain
        assert text.startswith("●·●\n2/3 slots busy (from /slots); slot 0 has decoded 120")
        assert panel.border_subtitle == "max_num_seqs from /slots"
        await pilot.press("q")
        await asyncio.sleep(0)


def trtllm_samples() -> list:
    import json

    from batchtop.core_engine.attach.scrape.scrape import Scraper
    from tests.support.route_server import Routes, route_server
    a, b = (DATA / "trtllm-a.json").read_text(), (DATA / "trtllm-b.json").read_text()
    routes = Routes({"/metrics": (200, a)})
    routes.queues["/metrics"] = [(200, a), (200, json.dumps(json.loads(b)))]
    with route_server(routes) as url:
        scraper = Scraper(url, timeout_s=2.0)
        samples = [dataclasses.replace(scraper.scrape().sample, t=float(t)) for t in (0, 2)]
        scraper.close()
    return samples


def fixture_samples(flavour: str) -> list:
    from tests.support.attach_helpers import sglang_text
    if flavour == "sglang":
        return [parse_exposition(sglang_text(3, 2, 0.4, 100 * t, 40 * t, [0.3] * t), float(t)) for t in (1, 3)]
    if flavour == "trtllm":
        return trtllm_samples()
    return [parse_exposition((DATA / f"{flavour}-{ab}.prom").read_text(), t) for ab, t in (("a", 0.0), ("b", 2.0))]


# what each server cannot fill, and where the panels say it (the words of each record in core_engine/attach/servers/)
CANNOT_FILL = {
    "sglang": {AttachSlotsPanel: ["SGLang does not export max_running_requests"],
               AttachWaitingPanel: ["SGLang gives no waiting reasons", "SGLang exposes no preemption counter"],
               AttachMetricsStrip: ["SGLang exposes no per-step token histogram",
                                    "SGLang exposes no finished-request counter"]},
    "lmdeploy": {AttachSlotsPanel: ["LMDeploy does not export max_batch_size"],
                 AttachWaitingPanel: ["LMDeploy gives no waiting reasons", "LMDeploy exposes no preemption counter"]},
    "nim": {AttachWaitingPanel: ["NIM gives no waiting reasons", "NIM exposes no preemption counter"],
            AttachMetricsStrip: ["NIM exposes no per-step token histogram"]},
    "trtllm": {AttachMetricsStrip: ["trtllm-serve's /metrics has no latency histograms",
                                    "TensorRT-LLM's rates are summed from its iteration stats since attach began"]},
}


@pytest.mark.parametrize("flavour", sorted(CANNOT_FILL))
async def test_each_servers_panels_say_what_it_cannot_fill(tmp_path, flavour):
    samples = fixture_samples(flavour)
    path = str(tmp_path / f"{flavour}.jsonl")
    record(path, samples)
    app = BatchtopApp(AttachReplaySource(read_trace(path), speed=64.0))
    async with app.run_test(size=(200, 46)) as pilot:
        await run_to_end(pilot, app, len(samples))
        for panel, words in CANNOT_FILL[flavour].items():
            rendered = app.query_one(panel).render()
            shown = rendered.plain if hasattr(rendered, "plain") else str(rendered)
            for w in words:
                assert w in shown, (panel.__name__, w, shown)
        await pilot.press("q")
