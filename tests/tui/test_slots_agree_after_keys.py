"""One frame, one truth: after every max_num_seqs key ([ ] + -) and every step, the Slots title, its grid,
the timeline under it, the Waiting panel and the metrics strip tell the same story about the slots.

Lowering max_num_seqs drops no running sequence: those past the new limit drain. They are shown ↓ and
counted apart ("Slots 2/4 busy · 4 draining"), never as busy slots beyond the limit; the vacancies they
count against are no bubbles; the timeline's rows follow the limit.
"""

from __future__ import annotations

import re

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Phase, Request
from batchtop.tui.app import BatchtopApp
from batchtop.tui.sources.live import EngineSource
from batchtop.tui.widgets.engine.metrics_strip import MetricsStrip
from batchtop.tui.widgets.engine.slots import SlotsPanel
from batchtop.tui.widgets.engine.waiting import WaitingPanel
from tests.conftest import tiny_config
from tests.tui.test_dashboard import PEAKS, TickClock, panel_text, step

HOLDING = (Phase.PREFILL, Phase.DECODE, Phase.IDLE, Phase.PADDING)
# slots 0-7 go to r0-r7 in order: r0 and r1 end early (their slots empty under a lowered limit while
# r4-r7 still run past it), the others run long; the rest wait
OUTPUTS = [3, 4, 20, 20, 24, 24, 24, 24] + [5 + (7 * i) % 12 for i in range(24)]
WORKLOAD = [Request(f"r{i}", tuple(range(1, 4 + i % 5)), n) for i, n in enumerate(OUTPUTS)]
GRID_CELL = re.compile(r"^\s*(\d+)([↓ ])(\S) (.*?)\s*$")
TIMELINE_ROW = re.compile(r"^\s*(\d+(?:-\d+)?)([↓ ])")  # "  0-1 ▀▀", "10-11↓▀▀": slots, draining mark
TITLE = re.compile(r"^Slots (\d+)/(\d+) busy(?: · (\d+) draining)? · grid$")


def grid_cells(text: str) -> dict[int, tuple[str, str, str]]:
    """The detailed grid's cells by slot number: (marker, glyph, label), read off the panel's text."""
    cells = {}
    for line in text.split("\n"):
        if line.startswith("─ last "):
            break
        for chunk in re.findall(r".{1,34}", line):  # DETAILED_WIDTH columns
            match = GRID_CELL.match(chunk)
            if match:
                cells[int(match[1])] = (match[2], match[3], match[4])
    return cells


def check_agreement(app: BatchtopApp, seen: dict[str, int]) -> None:
    snap = app.source.frame.snapshot
    limit = snap.max_num_seqs
    slots = app.query_one(SlotsPanel)
    # the truth, from the snapshot itself
    holders = {s.slot for s in snap.slots if s.phase in HOLDING}
    draining = {s for s in holders if s >= limit}
    busy = sum(s.phase in (Phase.PREFILL, Phase.DECODE) for s in snap.slots[:limit])

    title = TITLE.match(str(slots.border_title))
    assert title, slots.border_title
    assert (int(title[1]), int(title[2]), int(title[3] or 0)) == (busy, limit, len(draining)), slots.border_title
    assert int(title[1]) <= limit  # never "11/8 busy"

    text = panel_text(app, SlotsPanel)
    cells = grid_cells(text)
    for n in holders | set(range(limit)):
        assert n in cells, (n, text)  # every slot and every draining sequence is on the grid
    marked = {n for n, (marker, _, _) in cells.items() if marker == "↓"}
    assert marked == draining, (marked, draining)
    bubbles = {n for n, (_, _, label) in cells.items() if label.startswith("bubble")}
    assert all(n < limit for n in bubbles), bubbles  # a slot past the limit is no slot: never a bubble
    if len(holders) >= limit:  # the running sequences fill max_num_seqs: no place is free for the queue
        assert not bubbles, (bubbles, text)
    subtitle = str(slots.border_subtitle)
    counted = re.search(r"(\d+) bubbles?", subtitle)
    assert (int(counted[1]) if counted else 0) == len(bubbles), subtitle
    if draining:
        assert "↓ past max_num_seqs" in subtitle and "↓ draining" in text  # the look is explained
    # the vacancies under the limit that sequences past it (running, or finishing in this step) count against
    held = {n for n, (_, _, label) in cells.items() if label.startswith("held")}
    vacant = [n for n in range(limit) if snap.slots[n].phase is Phase.EMPTY]
    past = [s for s in snap.slots[limit:] if s.phase is not Phase.EMPTY]
    assert len(held) == min(len(past), len(vacant)) and held <= set(vacant), (held, text)
    seen["held"] += bool(held)

    # the timeline under the grid: one row per slot there is now, none for the retired ones past the limit
    lines = text.split("\n")
    caption = next(i for i, line in enumerate(lines) if line.startswith("─ last "))
    labels = [TIMELINE_ROW.match(line) for line in lines[caption + 1:]]
    pairs = [[int(n) for n in label[1].split("-")] for label in labels if label]
    shown = {s.slot for s in snap.slots if s.phase is not Phase.EMPTY}
    assert [n for pair in pairs for n in pair] == list(range(max([limit - 1, *shown]) + 1)), (pairs, limit, shown)
    for label, pair in zip((label for label in labels if label), pairs):
        assert (label[2] == "↓") == any(n in draining for n in pair), (label[0], draining)

    # Waiting: slots full exactly when the holders fill the limit, with the same numbers as the title
    waiting = panel_text(app, WaitingPanel)
    if snap.num_waiting:
        full = re.match(r"slots full: (\d+) running, max_num_seqs=(\d+)", waiting)
        if len(holders) >= limit and not snap.preempted:
            assert full and (int(full[1]), int(full[2])) == (len(holders), limit), waiting
            seen["full"] += 1
        if full:
            assert int(full[2]) == limit and int(full[1]) >= limit and not bubbles, waiting

    # the strip: "batch" is this step's rows, the utilisations are labelled as averages
    strip = app.query_one(MetricsStrip)
    batch = str(strip.query_one("#batch-label").render())
    assert batch.split() == ["batch", str(snap.num_seqs)], batch
    assert "avg: slots " in str(strip.query_one("#numbers").render())
    seen["draining"] += bool(draining)


async def test_title_grid_timeline_waiting_and_strip_agree_after_every_max_num_seqs_key():
    config = tiny_config(max_num_seqs=8, max_num_batched_tokens=256, num_kv_blocks=512)
    app = BatchtopApp(EngineSource(Engine(config, clock=TickClock()), WORKLOAD, start_paused=True, peaks=PEAKS,
                                   device_label="test-cpu"))
    seen = {"draining": 0, "held": 0, "full": 0}
    async with app.run_test(size=(160, 45)) as pilot:
        await step(pilot, 2)
        check_agreement(app, seen)
        plan = [("left_square_bracket", 4), ("minus", 3), ("plus", 4), ("right_square_bracket", 8),
                ("left_square_bracket", 4), ("left_square_bracket", 2)]
        for key, limit in plan:
            await pilot.press(key)
            for _ in range(3):  # the key takes effect at the next step; check that step and two more
                await step(pilot)
                assert app.source.frame.snapshot.max_num_seqs == limit
                check_agreement(app, seen)
        for _ in range(60):  # the drain ends: the grid shrinks back to the limit
            if len(app.source.frame.snapshot.slots) == 2:
                break
            await step(pilot)
            check_agreement(app, seen)
        assert len(app.source.frame.snapshot.slots) == 2
    assert seen["draining"] >= 5 and seen["held"] >= 1 and seen["full"] >= 1, seen
