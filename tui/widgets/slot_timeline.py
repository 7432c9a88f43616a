"""The Slots panel's timeline view: rows are slots, columns the most recent steps.

Each cell takes the colour of the request that held the slot in that step, so static batching shows
as blocks with ragged right edges (padding, ░) followed by a gap, and continuous batching as bands
that refill at once — the picture these two policies are usually explained with, drawn live.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from core_engine.request import Phase
from tui.frame import DashboardFrame

if TYPE_CHECKING:
    from tui.widgets.slots import SlotsPanel

CELL = {Phase.DECODE: "█", Phase.PREFILL: "▓", Phase.PADDING: "░", Phase.IDLE: "│", Phase.EMPTY: " "}
LABEL_WIDTH = 4


def render_timeline(panel: SlotsPanel, frame: DashboardFrame, width: int, height: int) -> Text:
    snap = frame.snapshot
    columns = frame.timeline[-max(1, width - LABEL_WIDTH):]
    num_slots = max([len(col) for col, _ in columns] + [len(snap.slots)])
    rows = min(num_slots, max(1, height - 1))
    bubble = panel.style("background", bgcolor_var="bubble")
    text = Text(no_wrap=True, overflow="crop")
    for slot in range(rows):
        text.append(f"{slot:>3} ", panel.style("muted"))
        for col, waiting in columns:
            index, phase = col[slot] if slot < len(col) else (-1, Phase.EMPTY)
            wasted = phase in (Phase.EMPTY, Phase.IDLE, Phase.PADDING)
            if waiting and wasted and slot < snap.max_num_seqs:
                text.append(CELL[phase] if phase is not Phase.EMPTY else "·", bubble)
            elif phase is Phase.EMPTY:
                text.append(" ")
            else:
                text.append(CELL[phase], panel.style(f"req-{index % 12}", dim=phase is Phase.PADDING))
        text.append("\n")
    hidden = num_slots - rows
    legend = "█ decode ▓ prefill ░ padding │ idle · bubble"
    text.append(f"{'':>{LABEL_WIDTH}}{legend}" + (f"   +{hidden} slots below" if hidden > 0 else ""),
                panel.style("muted"))
    return text
