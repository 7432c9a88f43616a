"""The Slots panel's timelines: rows are slots, columns the most recent steps.

Each cell takes the colour of the request that held the slot in that step, so static batching shows
as blocks with ragged right edges (padding) followed by a refill of the whole batch, and continuous
batching as bands that refill at once — the picture these two policies are usually explained with,
drawn live. The full view draws a glyph per cell; the compact view under the grid packs two slots
into each text row with half blocks (upper slot in the foreground colour, lower in the background).
"""

from __future__ import annotations

from itertools import groupby

from rich.cells import cell_len
from rich.text import Text

from batchtop.core_engine.sched.request import Phase
from batchtop.core_engine.engine.snapshot import SlotState
from batchtop.core_engine.run.frame import SlotCell, SlotColumn
from batchtop.tui.widgets.common.text_fit import first_fit
from batchtop.tui.widgets.common.panel import Panel, Runs
from batchtop.tui.widgets.engine.slot_count import SlotCount, SlotRole
from batchtop.tui.widgets.engine.slot_look import (DRAINING_GLYPH, LegendEntry, add_legend, colour_var, legend_entries,
                                                   timeline_legend, timeline_look)

EMPTY_CELL: SlotCell = (-1, Phase.EMPTY, SlotState.FREE, False)
LABEL_WIDTH = 4
COMPACT_LABEL_WIDTH = 6  # "14-15 "


def _cell(column: SlotColumn, slot: int) -> SlotCell:
    return column[slot] if slot < len(column) else EMPTY_CELL


def _colour(cell: SlotCell) -> str | None:
    index, _, state, padded = cell
    return colour_var(index, state, padded)


def _draining(count: SlotCount, slot: int) -> bool:
    return slot < count.rows and count.roles[slot] is SlotRole.DRAINING


def render_timeline(panel: Panel, timeline: tuple[SlotColumn, ...], count: SlotCount, width: int,
                    height: int, top: int = 0) -> tuple[Text, int]:
    """Full view: one text row per slot there is now (count.rows: max_num_seqs, and the draining ones past
    it) from slot `top` on, a glyph per step, and on the last row which slots are shown when not all of
    them fit, and the legend of what is drawn. Returns the text and the `top` it used (kept within the
    slots)."""
    columns = timeline[-max(1, width - LABEL_WIDTH):]
    num_slots = count.rows
    rows = min(num_slots, max(1, height - 1))
    top = max(0, min(top, num_slots - rows))
    muted, draining = panel.style("muted"), panel.style("foreground", bgcolor_var="draining")
    looks: dict[SlotCell, tuple] = {}
    shown: set[str] = set()
    out = Runs()
    for slot in range(top, top + rows):
        if _draining(count, slot):
            shown.add("draining")
            out.add(f"{slot:>3}", muted)
            out.add(DRAINING_GLYPH, draining)
        else:
            out.add(f"{slot:>3} ", muted)
        for cell, run in groupby(_cell(col, slot) for col in columns):  # a request holds its slot for many
            if cell not in looks:                                      # steps: draw runs, not cells
                looks[cell] = timeline_look(panel, *cell)
                shown.update(legend_entries(cell))
            glyph, style = looks[cell]
            out.add(glyph * sum(1 for _ in run), style)
        out.newline()
    out.add(" " * LABEL_WIDTH, muted)
    room = width - LABEL_WIDTH
    legend = timeline_legend(panel, shown)
    if rows < num_slots:  # the cut comes first; then the legend, its most telling entry at least
        total = f"{count.limit}+{count.draining}{DRAINING_GLYPH}" if count.draining else f"{count.limit}"
        first = 2 + cell_len(legend[0][2]) + (2 if len(legend) > 1 else 0) if legend else 0
        note = first_fit([f"slots {top}-{top + rows - 1} of {count.range_label()} · ↑↓ scroll · ",
                          f"{top}-{top + rows - 1} of {total} · ↑↓ · "], max(0, room - first))
        out.add(note, panel.style("warning"))
        room -= cell_len(note)
    add_legend(panel, out, legend, room)
    return out.text(), top


def compact_legend(panel: Panel, timeline: tuple[SlotColumn, ...], count: SlotCount, width: int,
                   rows: int) -> list[LegendEntry]:
    """What the compact timeline's colours mean, for those it draws: bubble, padding and padded prompt
    (request colours need no entry), and the ↓ on draining slots' labels."""
    shown = min(count.rows, 2 * rows)
    seen = {_colour(cell) for col in timeline[-max(1, width - COMPACT_LABEL_WIDTH):] for cell in col[:shown]}
    entries = [(name, var) for name, var in (("bubble", "bubble"), ("padding", "phase-padding"),
                                             ("padded prompt", "prompt-pad")) if var in seen]
    out: list[LegendEntry] = [("▀", panel.style(var), name) for name, var in entries]
    if any(_draining(count, slot) for slot in range(shown)):
        out.insert(1 if entries and entries[0][0] == "bubble" else 0,
                   (DRAINING_GLYPH, panel.style("foreground", bgcolor_var="draining"), "draining"))
    return out


def render_compact_timeline(panel: Panel, out: Runs, timeline: tuple[SlotColumn, ...], count: SlotCount,
                            width: int, rows: int) -> int:
    """Two slots per text row, for the slots there are now (count.rows); returns how many it showed (the
    rest are cut)."""
    columns = timeline[-max(1, width - COMPACT_LABEL_WIDTH):]
    num_slots = count.rows
    shown = min(num_slots, 2 * rows)
    muted, draining = panel.style("muted"), panel.style("foreground", bgcolor_var="draining")
    for top in range(0, shown, 2):
        out.newline()
        label = f"{top}-{top + 1}" if top + 1 < shown else f"{top}"
        marked = _draining(count, top) or (top + 1 < shown and _draining(count, top + 1))
        out.add(f"{label:>{COMPACT_LABEL_WIDTH - 1}}", muted)
        out.add(DRAINING_GLYPH if marked else " ", draining if marked else muted)
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
