"""The Roofline panels never drop a point or cut their text without a sign: a step above the roof is
drawn as ↑ (clamped to the edge when off the axes) and counted with why; the roofs follow the live
source when it measures them again; the verdict wraps, says when this device's ridge is what makes
decode compute-bound, and only gives way to "…" where the panel is too short."""

from __future__ import annotations

from types import SimpleNamespace

from tests.support.panel_host import Host

from batchtop.core_engine.perf.roofline_point import RooflinePoint as AttachPoint
from batchtop.core_engine.config import preset
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.model.cost import Chunk, step_cost
from batchtop.core_engine.perf import live_roofs as lr
from batchtop.core_engine.perf.device_peaks import DevicePeaks, datasheet_peaks
from batchtop.gpu_kernels import cpu_kernels
from batchtop.tui.app import BatchtopApp
from batchtop.tui.sources.live import EngineSource
from batchtop.tui.widgets.attach.roofline import AttachRooflinePanel
from batchtop.tui.widgets.common.roofline_plot import ABOVE, BELOW, PlotPoint, roofline_plot
from batchtop.tui.widgets.engine.device import DevicePanel
from batchtop.tui.widgets.engine.roofline import RooflinePanel
from tests.conftest import tiny_config
from tests.tui.test_dashboard import WORKLOAD, TickClock, panel_text, step, wait_for

LOW = DevicePeaks("Test CPU", 2e6, 1e5, "measured:test")  # far below what any step of the tiny model does
HIGH = DevicePeaks("Test CPU", 4e13, 3.5e12, "measured:test")
AVX2 = DevicePeaks("AVX2 CPU", 99e9, 11e9, "measured:test")  # ridge 9: bf16 as unpacked fp32 FMAs


def live_app(peaks: DevicePeaks, *, live_roofs: bool, notes: list | None = None) -> BatchtopApp:
    engine = Engine(tiny_config(), clock=TickClock())
    source = EngineSource(engine, WORKLOAD, start_paused=True, peaks=peaks, live_roofs=live_roofs)
    app = BatchtopApp(source)
    if notes is not None:
        shown = source.notify
        source.notify = lambda kind, text: (notes.append((kind, text)), shown(kind, text))
    return app


def test_points_off_the_axes_are_clamped_to_the_edge_with_their_own_mark():
    plot = roofline_plot(HIGH, [PlotPoint(10.0, 1e20), PlotPoint(10.0, 1.0), PlotPoint(10.0, 1e13)], 30, 8)
    top, bottom = plot.rows[0], plot.rows[-2]  # the last row is the x axis
    assert any(glyph == ABOVE for glyph, _ in top) and any(glyph == BELOW for glyph, _ in bottom)
    assert (plot.above, plot.below) == (1, 1)
    assert plot.note() == f"{ABOVE} 1 step above the roof (up to >1000x) {BELOW} 1 under the axis"
    assert all(len(row) == 30 for row in plot.rows)


async def test_steps_above_the_roof_are_drawn_as_marks_and_the_panel_says_why():
    app = live_app(LOW, live_roofs=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await step(pilot, 3)
        panel = app.query_one(RooflinePanel)
        text = panel_text(app, RooflinePanel)
        plot_rows = text.splitlines()[:-3]
        assert sum(row.count(ABOVE) for row in plot_rows) >= 1  # the points share cells at this size
        assert f"{ABOVE} 3 steps above the roof" in text and "these roofs sit below" in text
        assert panel.border_subtitle.startswith(f"{ABOVE}3 above")


async def test_a_step_that_beats_the_live_roofs_has_them_measured_again_and_the_panels_say_so(monkeypatch):
    measured, notes = [], []
    monkeypatch.setattr(lr, "device_peaks", lambda device, dtype, refresh=False: measured.append(refresh) or HIGH)
    app = live_app(LOW, live_roofs=True, notes=notes)
    async with app.run_test(size=(100, 30)) as pilot:
        await step(pilot)
        await wait_for(pilot, lambda: "roofs 40 TFLOP/s · 3.5 TB/s" in panel_text(app, DevicePanel))
        assert measured == [True]
        assert [text for kind, text in notes if kind == "info"][0].startswith("a step ran at")
        await step(pilot, 2)
        assert ABOVE not in panel_text(app, RooflinePanel)  # under the roofs measured again
        assert app.source.frame.roofs.peaks == HIGH


async def test_a_step_still_above_roofs_measured_again_raises_them_and_the_device_panel_says_which(monkeypatch):
    monkeypatch.setattr(lr, "device_peaks", lambda device, dtype, refresh=False: LOW)  # a busy host, again
    app = live_app(LOW, live_roofs=True)
    async with app.run_test(size=(160, 40)) as pilot:
        await step(pilot)
        await wait_for(pilot, lambda: "raised compute by step 1 at t=" in panel_text(app, DevicePanel))
        await step(pilot, 2)
        assert ABOVE not in panel_text(app, RooflinePanel)  # every step at most at the roofs it raised
        assert app.source.frame.roofs.peaks.peak_flops > LOW.peak_flops


async def test_when_the_cpu_kernels_come_in_the_roofs_are_measured_with_them(monkeypatch):
    notes = []
    monkeypatch.setattr(lr, "device_peaks", lambda device, dtype, refresh=False: HIGH)
    came_in = iter([True])
    monkeypatch.setattr(cpu_kernels, "switch_in", lambda: next(came_in, False))
    app = live_app(LOW, live_roofs=True, notes=notes)
    async with app.run_test(size=(100, 30)) as pilot:
        await step(pilot)
        await wait_for(pilot, lambda: "roofs 40 TFLOP/s · 3.5 TB/s" in panel_text(app, DevicePanel))
        assert ("info", "roofs re-measured with the C++ kernels: 40 TFLOP/s, 3.5 TB/s") in notes


def decode_frame(rows: int = 16, context: int = 128, trail=()) -> SimpleNamespace:
    cost = step_cost(preset("cpu-demo"), "bfloat16", [Chunk(context, 1)] * rows, num_logit_rows=rows)
    snap = SimpleNamespace(cost=cost, decode_cost=cost, num_decode_rows=rows, num_prefill_tokens=0)
    return SimpleNamespace(trail=trail, last_decode=snap, roofs=None)


async def rendered(panel, frame, size: tuple[int, int]) -> list[str]:
    app = Host(panel)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        panel.frame = frame
        return panel.render().plain.splitlines()


async def test_the_verdict_wraps_and_says_when_this_devices_ridge_makes_decode_compute_bound():
    lines = await rendered(RooflinePanel(AVX2), decode_frame(), (38, 14))
    text = " ".join(line.strip() for line in lines)
    assert "decode x16: compute-bound on this device (ridge 9 FLOP/B), +1 seq +6% · attention memory-bound" in text
    assert "a GPU's ridge is 150-420 FLOP/B: decode there stays memory-bound to ~150 rows" in text
    assert not any(line.rstrip().endswith("…") for line in lines) and all(len(line) <= 38 for line in lines)
    gpu = " ".join(await rendered(RooflinePanel(datasheet_peaks("H200")), decode_frame(), (38, 14)))
    assert "decode x16: memory-bound, +1 seq" in gpu and "ridge" not in gpu  # a GPU's verdict needs no such word


async def test_a_verdict_too_long_for_the_panel_keeps_its_start_and_ends_in_an_ellipsis():
    lines = await rendered(RooflinePanel(AVX2), decode_frame(), (38, 6))
    assert lines[-1].startswith("decode x16: compute-bound on this") and lines[-1].endswith("…")


async def test_the_attach_roofline_marks_intervals_above_the_roof_and_says_why():
    above = AttachPoint(16.0, 3 * AVX2.peak_flops, "measured")
    frame = SimpleNamespace(main=SimpleNamespace(point=above, point_note=None), tick=1, streams=None,
                            history=[SimpleNamespace(point=above)] * 3)
    panel = AttachRooflinePanel(AVX2, "--device cpu: measured:test")
    text = "\n".join(await rendered(panel, frame, (60, 16)))
    assert ABOVE in text and f"{ABOVE} 3 intervals above the roof (up to 3x)" in text
    assert "is --device right?" in text and "300% of the roof" in text.replace("\n", " ")
    assert "compute-bound on this device (ridge 9 FLOP/B)" in text.replace("\n", " ")
