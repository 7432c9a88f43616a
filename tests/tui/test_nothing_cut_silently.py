"""Nothing is cut without a sign: every engine panel, drawn at 80x24 and 160x45 over a busy engine
(a queue longer than the panel, a lowered max_num_seqs draining, prefix sharing, long request ids),
shows each line it wanted to write whole, or ends it with "…"; a panel with more rows than fit says
how many are hidden or which key shows them; the legend lists what is drawn; the fitted border titles
are never cut by the border.

"What it wanted to write" is the panel's own render() (its lines before the screen crops them); what
the user sees is the same region of the composed screen.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
from rich.cells import cell_len

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request
from batchtop.tui.app import BatchtopApp
from batchtop.tui.sources.live import EngineSource
from batchtop.tui.widgets.engine.device import DevicePanel
from batchtop.tui.widgets.engine.kv_blocks import KVBlocksPanel
from batchtop.tui.widgets.engine.metrics_strip import MetricsStrip
from batchtop.tui.widgets.engine.roofline import RooflinePanel
from batchtop.tui.widgets.engine.slots import SlotsPanel
from batchtop.tui.widgets.engine.waiting import WaitingPanel
from tests.conftest import tiny_config
from tests.tui.test_dashboard import PEAKS, TickClock, screen_text, step

SIZES = [(80, 24), (160, 45)]
SHARED = tuple(range(1, 13))  # a common prompt prefix: blocks shared through the prefix cache
WORKLOAD = [Request(f"chat-session-{i:04d}", SHARED + tuple(range(20, 22 + i % 9)), 8 + (11 * i) % 30)
            for i in range(48)]
IDS = {r.id for r in WORKLOAD}
HINT = re.compile(r"…|\bmore\b|\bv:|↑↓")  # what a panel that cannot show every row says instead


def busy_app() -> BatchtopApp:
    config = tiny_config(max_num_seqs=12, max_num_batched_tokens=256, num_kv_blocks=160)
    app = BatchtopApp(EngineSource(Engine(config, clock=TickClock()), WORKLOAD, start_paused=True, peaks=PEAKS,
                                   device_label="test-cpu"))
    return app


async def drive_busy(pilot) -> None:
    await step(pilot, 5)
    await pilot.press("left_square_bracket")  # 12 -> 6: six sequences drain past the new limit
    await step(pilot, 2)


def region_lines(app: BatchtopApp, widget) -> list[str]:
    """What the screen shows in the widget's content region, row by row."""
    region = widget.content_region
    screen = screen_text(app).split("\n")
    return [screen[region.y + r][region.x:region.x + region.width] for r in range(region.height)]


def unmarked_cuts(app: BatchtopApp, widget) -> list[str]:
    """Lines the widget wanted to write that the screen cuts without "…", and rows it loses without a hint."""
    wanted = widget.render().plain.split("\n")
    shown = region_lines(app, widget)
    width, height = widget.content_region.width, widget.content_region.height
    problems = []
    for want, got in zip(wanted, shown):
        if cell_len(want.rstrip()) > width and not got.rstrip().endswith("…"):
            problems.append(f"cut without …: wanted {want.rstrip()!r}, shown {got.rstrip()!r}")
    if len(wanted) > height and not HINT.search(shown[-1]):
        problems.append(f"{len(wanted) - height} rows cut without a hint; last shown {shown[-1].rstrip()!r}")
    return problems


def cut_ids(lines: list[str]) -> list[str]:
    """Request ids shown shortened without "…": a piece of an id standing for the whole."""
    out = []
    for line in lines:
        for token in re.findall(r"…?[\w-]{4,}…?", line):
            bare = token.strip("…")
            if token == bare and bare not in IDS and any(bare in i for i in IDS):
                out.append(token)
    return out


def titles_fit(panel) -> list[str]:
    room = panel.outer_size.width - 6
    return [f"{which} {text!r} longer than {room}" for which, text in
            (("title", str(panel.border_title or "")), ("subtitle", str(panel.border_subtitle or "")))
            if cell_len(text) > room]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("panel_type", [SlotsPanel, KVBlocksPanel, WaitingPanel, DevicePanel],
                         ids=lambda t: t.__name__)
async def test_an_engine_panel_cuts_nothing_without_a_sign(panel_type, size):
    app = busy_app()
    async with app.run_test(size=size) as pilot:
        await drive_busy(pilot)
        panel = app.query_one(panel_type)
        problems = unmarked_cuts(app, panel) + [f"id cut: {t}" for t in cut_ids(region_lines(app, panel))]
        if panel_type is not DevicePanel:  # the panels whose titles are fitted to their border
            problems += titles_fit(panel)
        if panel_type is SlotsPanel:  # and in its full timeline, with the legend at the bottom
            await pilot.press("v")
            await pilot.pause()
            problems += unmarked_cuts(app, panel) + titles_fit(panel)
        assert not problems, problems


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_roofline_panel_cuts_nothing_without_a_sign(size):
    app = busy_app()
    async with app.run_test(size=size) as pilot:
        await drive_busy(pilot)
        assert not unmarked_cuts(app, app.query_one(RooflinePanel))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_metrics_strip_cuts_nothing_without_a_sign_and_labels_its_averages(size):
    app = busy_app()
    async with app.run_test(size=size) as pilot:
        await drive_busy(pilot)
        strip = app.query_one(MetricsStrip)
        for label in ("#tok-label", "#batch-label", "#numbers"):
            assert not unmarked_cuts(app, strip.query_one(label)), label
        assert "avg: slots " in "".join(region_lines(app, strip.query_one("#numbers")))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_waiting_footer_fits_its_pace_and_arrivals(size):
    """The closed-loop pacer's first-wave label, with arrivals still to come, shortens to fit the footer
    instead of being cut ("paced from...")."""
    app = busy_app()
    async with app.run_test(size=size) as pilot:
        await drive_busy(pilot)
        panel = app.query_one(WaitingPanel)
        frame = app.source.frame
        for speed in (0.0, 1.5):  # titles are set as the frame is shown
            snap = dataclasses.replace(frame.snapshot, arrival_speed=speed, num_pending_arrivals=1234)
            panel.show(dataclasses.replace(frame, snapshot=snap), force=True)
            assert not titles_fit(panel), panel.border_subtitle
            assert "1234" in str(panel.border_subtitle) and ("wave" if speed == 0 else "1.5x") in \
                str(panel.border_subtitle)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_timeline_legend_keeps_the_entries_of_what_is_drawn(size):
    """Bubbles on screen: "bubble" is in the legend, whatever else it has to drop ("…" where it does);
    the entries of what is not on screen go first."""
    config = tiny_config(max_num_seqs=12, max_num_batched_tokens=256, num_kv_blocks=16)  # KV-bound: bubbles
    app = BatchtopApp(EngineSource(Engine(config, clock=TickClock()), WORKLOAD, start_paused=True, peaks=PEAKS))
    async with app.run_test(size=size) as pilot:
        await step(pilot, 6)
        await pilot.press("v")
        await pilot.pause()
        panel = app.query_one(SlotsPanel)
        shown = region_lines(app, panel)
        last = min(panel.content_region.height, len(panel.render().plain.split("\n"))) - 1
        rows, legend = [line[4:] for line in shown[:last]], shown[last]
        bubbles_drawn = any("·" in row or "│" in row for row in rows)  # the glyphs drawn on the bubble colour
        assert bubbles_drawn, "\n".join(shown)  # the state this test is about
        assert "· bubble" in legend, legend
        assert ("▒ padded prompt" in legend) == any("▒" in row for row in rows)  # nothing static here: absent
        assert not unmarked_cuts(app, panel)
