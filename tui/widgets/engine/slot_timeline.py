"""The Slots panel's timelines: rows are slots, columns the most recent steps.

Each cell takes the colour of the request that held the slot in that step, so static batching shows
as blocks with ragged right edges (padding) followed by a refill of the whole batch, and continuous
batching as bands that refill at once — the picture these two policies are usually explained with,
drawn live. The full view draws a glyph per cell; the compact view under the grid packs two slots
into each text row with half blocks (upper slot in the foreground colour, lower in the background).
"""

from __future__ import annotations

from itertools import groupby

from rich.text import Text

from batchtop.core_engine.sched.request import Phase
from batchtop.core_engine.engine.snapshot import SlotState
from batchtop.tui.sources.frame import SlotCell, SlotColumn
from batchtop.tui.widgets.common.panel import Panel, Runs
from batchtop.tui.widgets.engine.slot_look import TIMELINE_LEGEND, colour_var, timeline_look

EMPTY_CELL: SlotCell = (-1, Phase.EMPTY, SlotState.FREE, False)
LABEL_WIDTH = 4
COMPACT_LABEL_WIDTH = 6  # "14-15 "


def _cell(column: SlotColumn, slot: int) -> SlotCell:
    return column[slot] if slot < len(column) else EMPTY_CELL


def _colour(cell: SlotCell) -> str | None:
    index, _, state, padded = cell
    return colour_var(index, state, padded)


def render_timeline(panel: Panel, timeline: tuple[SlotColumn, ...], num_slots: int, width: int,
                    height: int, top: int = 0) -> tuple[Text, int]:
    """Full view: one text row per slot from slot `top` on, a glyph per step, and a legend on the last row,
    which says which slots are shown when not all of them fit. Returns the text and the `top` it used
    (kept within the slots)."""
    columns = timeline[-max(1, width - LABEL_WIDTH):]
    num_slots = max([len(col) for col in columns] + [num_slots])
    rows = min(num_slots, max(1, height - 1))
    top = max(0, min(top, num_slots - rows))
    muted = panel.style("muted")
    looks: dict[SlotCell, tuple] = {}
    out = Runs()
    for slot in range(top, top + rows):
        out.add(f"{slot:>3} ", muted)
        for cell, run in groupby(_cell(col, slot) for col in columns):  # a request holds its slot for many
            if cell not in looks:                                      # steps: draw runs, not cells
                looks[cell] = timeline_look(panel, *cell)
            glyph, style = looks[cell]
            out.add(glyph * sum(1 for _ in run), style)
        out.newline()
    if rows < num_slots:  # the cut comes first, so a narrow panel keeps it and loses the legend
        out.add(f"{'':>{LABEL_WIDTH}}slots {top}-{top + rows - 1} of {num_slots} · ↑↓ scroll · ",
                panel.style("warning"))
        out.add(TIMELINE_LEGEND, muted)
    else:
        out.add(f"{'':>{LABEL_WIDTH}}{TIMELINE_LEGEND}", muted)
    return out.text(), top


def render_compact_timeline(panel: Panel, out: Runs, timeline: tuple[SlotColumn, ...], num_slots: int,
                            width: int, rows: int) -> int:
    """Two slots per text row; returns how many slots it showed (the rest are cut)."""
    columns = timeline[-max(1, width - COMPACT_LABEL_WIDTH):]
    shown = min(num_slots, 2 * rows)
    muted = panel.style("muted")
    for top in range(0, shown, 2):
        out.newline()
        label = f"{top}-{top + 1}" if top + 1 < shown else f"{top}"
        out.add(f"{label:>{COMPACT_LABEL_WIDTH - 1}} ", muted)
        pairs = ((_colour(_cell(col, top)), _colour(_cell(col, top + 1)) if top + 1 < shown else None)
                 for col in columns)
        for (upper, lower), run in groupby(pairs):
            n = sum(1 for _ in run)
            if upper is None and lower is None:
                out.add(" " * n)
            elif upper is None:
                out.add("▄" * n, panel.style(lower))
            else:
                out.add("▀" * n, panel.style(upper, bgcolor_var=lower))
    return shown
