"""How one slot in one step looks, in the grid and in the timeline: glyph and colour by SlotState.

Colour follows the engine's single definition of slot states (core_engine's SlotState): working
slots take their request's colour, padding the padding colour, bubbles the bubble colour, free
slots none. Glyphs carry the phase too, so colour is never the only channel.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.style import Style

from batchtop.core_engine.sched.request import Phase
from batchtop.core_engine.engine.snapshot import SlotState
from batchtop.tui.widgets.common.panel import Panel

GRID_GLYPH = {Phase.PREFILL: "▸", Phase.DECODE: "●", Phase.PADDING: "░", Phase.IDLE: "‖", Phase.EMPTY: "·",
              Phase.FINISHED: "✓"}
TIMELINE_GLYPH = {Phase.DECODE: "█", Phase.PREFILL: "▓", Phase.PADDING: "░", Phase.IDLE: "│", Phase.EMPTY: "·",
                  Phase.FINISHED: "✓"}
PADDED_PREFILL_GLYPH = "▒"  # a static batch member's prefill, with pad tokens left of its prompt
TIMELINE_LEGEND = "█ decode ▓ prefill ▒ padded prompt ░ padding ✓ finished │ idle · bubble"


def colour_var(index: int, state: SlotState, padded: bool) -> str | None:
    """The theme variable a slot-step is painted in; None: not painted (a free slot)."""
    if state is SlotState.WORKING:
        return "prompt-pad" if padded else f"req-{index % 12}"
    if state is SlotState.PADDING:
        return "phase-padding"
    if state is SlotState.BUBBLE:
        return "bubble"
    return None


def timeline_look(panel: Panel, index: int, phase: Phase, state: SlotState, padded: bool) -> tuple[str, Style | None]:
    """Glyph and style of one cell of the full-height timeline."""
    if state is SlotState.BUBBLE:
        return TIMELINE_GLYPH[phase], panel.style("background", bgcolor_var="bubble")
    if state is SlotState.FREE:
        return " ", None
    if state is SlotState.PADDING:
        return TIMELINE_GLYPH[phase], panel.request_style(index, dim=True)
    if padded:
        return PADDED_PREFILL_GLYPH, panel.style("prompt-pad")
    return TIMELINE_GLYPH[phase], panel.request_style(index)


ONE_LINE = str.maketrans({"\n": "⏎", "\r": None, "\t": " "})


def text_tail(text: str, width: int) -> str:
    """The end of text that fits `width` terminal cells on one line (newlines shown as ⏎), padded to it."""
    tail = "".join(c for c in text[-width:].translate(ONE_LINE) if c.isprintable())  # >= 1 cell each
    while cell_len(tail) > width:  # wide characters (CJK, emoji) take two
        tail = tail[1:]
    return tail + " " * (width - cell_len(tail))
