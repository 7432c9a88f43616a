"""The Slots panel's timeline view: rows are slots, columns the most recent steps.

Each cell takes the colour of the request that held the slot in that step, so static batching shows
as blocks with ragged right edges (padding, ░) followed by a gap, and continuous batching as bands
that refill at once — the picture these two policies are usually explained with, drawn live.
"""

from __future__ import annotations

from itertools import groupby
from typing import TYPE_CHECKING

from rich.text import Text

from batchtop.core_engine.engine.request import Phase
from batchtop.tui.frame import DashboardFrame
from batchtop.tui.widgets.panel import Runs

if TYPE_CHECKING:
    from batchtop.tui.widgets.slots import SlotsPanel

CELL = {Phase.DECODE: "█", Phase.PREFILL: "▓", Phase.PADDING: "░", Phase.IDLE: "│", Phase.EMPTY: " "}
WASTED = (Phase.EMPTY, Phase.IDLE, Phase.PADDING)
EMPTY_CELL = (-1, Phase.EMPTY)
LABEL_WIDTH = 4


def render_timeline(panel: SlotsPanel, frame: DashboardFrame, width: int, height: int) -> Text:
    snap = frame.snapshot
    columns = frame.timeline[-max(1, width - LABEL_WIDTH):]
    num_slots = max([len(col) for col, _ in columns] + [len(snap.slots)])
    rows = min(num_slots, max(1, height - 1))
    bubble = panel.style("background", bgcolor_var="bubble")
    muted = panel.style("muted")
    looks: dict[tuple, tuple[str, object]] = {}

    def look(cell: tuple[int, Phase], wasted_while_waiting: bool) -> tuple[str, object]:
        index, phase = cell
        if wasted_while_waiting and phase in WASTED:
            return (CELL[phase] if phase is not Phase.EMPTY else "·"), bubble
        if phase is Phase.EMPTY:
            return " ", None
        return CELL[phase], panel.request_style(index, dim=phase is Phase.PADDING)

    out = Runs()
    for slot in range(rows):
        out.add(f"{slot:>3} ", muted)
        in_cap = slot < snap.max_num_seqs
        keys = ((col[slot] if slot < len(col) else EMPTY_CELL, waiting and in_cap) for col, waiting in columns)
        for key, run in groupby(keys):  # a request holds its slot for many steps: draw runs, not cells
            if key not in looks:
                looks[key] = look(*key)
            glyph, style = looks[key]
            out.add(glyph * sum(1 for _ in run), style)
        out.newline()
    hidden = num_slots - rows
    legend = "█ decode ▓ prefill ░ padding │ idle · bubble"
    out.add(f"{'':>{LABEL_WIDTH}}{legend}" + (f"   +{hidden} slots below" if hidden > 0 else ""), muted)
    return out.text()
