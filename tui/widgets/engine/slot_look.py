"""How one slot in one step looks, in the grid and in the timeline: glyph and colour by SlotState.

Colour follows the engine's single definition of slot states (core_engine's SlotState): working
slots take their request's colour, padding the padding colour, bubbles the bubble colour, free
slots none. Glyphs carry the phase too, so colour is never the only channel. Slots past a lowered
max_num_seqs (slot_count) are marked ↓ on the $draining background; a legend lists only what is drawn.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.style import Style

from batchtop.core_engine.sched.request import Phase
from batchtop.core_engine.engine.snapshot import SlotState
from batchtop.tui.widgets.common.panel import Panel, Runs

GRID_GLYPH = {Phase.PREFILL: "▸", Phase.DECODE: "●", Phase.PADDING: "░", Phase.IDLE: "‖", Phase.EMPTY: "·",
              Phase.FINISHED: "✓"}
TIMELINE_GLYPH = {Phase.DECODE: "█", Phase.PREFILL: "▓", Phase.PADDING: "░", Phase.IDLE: "│", Phase.EMPTY: "·",
                  Phase.FINISHED: "✓"}
PADDED_PREFILL_GLYPH = "▒"  # a static batch member's prefill, with pad tokens left of its prompt
DRAINING_GLYPH = "↓"  # a sequence past a lowered max_num_seqs, running until it finishes

# the timeline's legend entries, most telling first (a narrow legend keeps these): glyph and label
LEGEND: dict[str, tuple[str, str]] = {
    "bubble": ("·", "bubble"), "draining": (DRAINING_GLYPH, "draining"), "idle": ("│", "idle"),
    "decode": ("█", "decode"), "prefill": ("▓", "prefill"), "padded": (PADDED_PREFILL_GLYPH, "padded prompt"),
    "padding": ("░", "padding"), "finished": ("✓", "finished"),
}
PHASE_ENTRY = {Phase.DECODE: "decode", Phase.PREFILL: "prefill", Phase.PADDING: "padding", Phase.FINISHED: "finished",
               Phase.IDLE: "idle"}
LegendEntry = tuple[str, Style, str]  # glyph, its style, label


def colour_var(index: int, state: SlotState, padded: bool) -> str | None:
    """The theme variable a slot-step is painted in; None: not painted (a free slot)."""
    if state is SlotState.WORKING:
        return "prompt-pad" if padded else f"req-{index % 12}"
    if state is SlotState.PADDING:
        return "phase-padding"
    if state is SlotState.BUBBLE:
        return "bubble"
    return None


def legend_entries(cell: tuple[int, Phase, SlotState, bool]) -> tuple[str, ...]:
    """The legend entries one timeline cell needs (a bubble cell: "bubble", and "idle" if it was idle)."""
    _, phase, state, padded = cell
    if state is SlotState.FREE:
        return ()
    if state is SlotState.BUBBLE:
        return ("bubble", "idle") if phase is Phase.IDLE else ("bubble",)
    if padded:
        return ("padded",)
    if state is SlotState.PADDING:
        return ("padding",)
    entry = PHASE_ENTRY.get(phase)
    return (entry,) if entry else ()


def timeline_legend(panel: Panel, shown: set[str]) -> list[LegendEntry]:
    """The full timeline's legend entries for the LEGEND names in `shown`, drawn as the cells are."""
    bubble, plain = panel.style("background", bgcolor_var="bubble"), panel.style("foreground")
    looks = {"bubble": bubble, "idle": bubble, "draining": panel.style("foreground", bgcolor_var="draining")}
    return [(LEGEND[n][0], looks.get(n, plain), LEGEND[n][1]) for n in LEGEND if n in shown]


def add_legend(panel: Panel, out: Runs, entries: list[LegendEntry], width: int) -> int:
    """A legend ("█ decode · bubble"): every entry when they fit `width` cells, else as many as fit beside
    a closing "…" that says the rest is cut. Returns the cells it took."""
    sizes = [(1 if i else 0) + 2 + cell_len(label) for i, (_, _, label) in enumerate(entries)]
    keep = len(entries)
    if sum(sizes) > width:
        keep = 0
        while keep < len(entries) and sum(sizes[:keep + 1]) + 2 <= width:
            keep += 1
    muted = panel.style("muted")
    for i, (glyph, style, label) in enumerate(entries[:keep]):
        if i:
            out.add(" ", muted)
        out.add(glyph, style)
        out.add(f" {label}", muted)
    used = sum(sizes[:keep])
    if keep < len(entries):
        cut = (" …" if keep else "…")[:max(0, width)]
        out.add(cut, muted)
        used += len(cut)
    return used


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
    """The end of text that fits `width` terminal cells on one line (newlines shown as ⏎), padded to it;
    "…" first when the start is cut."""
    source = text[-2 * width:] if width > 0 else ""  # enough for width cells, a few unprintable ones aside
    tail = "".join(c for c in source.translate(ONE_LINE) if c.isprintable())  # >= 1 cell each
    cut = len(source) < len(text) or cell_len(tail) > width
    room = width - 1 if cut else width
    while cell_len(tail) > max(0, room):  # wide characters (CJK, emoji) take two
        tail = tail[1:]
    if cut and width > 0:
        tail = "…" + tail
    return tail + " " * (width - cell_len(tail))
