"""The Slots panel: who holds each of max_num_seqs slots, in which phase, how far along.

Bubbles — a slot that is empty, idle or padding while requests wait — are drawn on the $bubble colour,
so the waste static batching leaves behind is the first thing the eye finds. `v` flips the panel to a
timeline (tui.widgets.slot_timeline).
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text

from batchtop.core_engine.engine.request import Phase
from batchtop.core_engine.engine.snapshot import SlotView, StepSnapshot
from batchtop.tui.frame import DashboardFrame
from batchtop.tui.widgets.panel import Panel, Runs
from batchtop.tui.widgets.slot_timeline import render_timeline

GLYPH = {Phase.PREFILL: "▸", Phase.DECODE: "●", Phase.PADDING: "░", Phase.IDLE: "‖", Phase.EMPTY: "·"}
WASTED = (Phase.EMPTY, Phase.IDLE, Phase.PADDING)
DETAILED_WIDTH, MEDIUM_WIDTH, COMPACT_WIDTH = 34, 13, 3


def is_bubble(slot: SlotView, snap: StepSnapshot) -> bool:
    return slot.phase in WASTED and snap.num_waiting > 0 and slot.slot < snap.max_num_seqs


def progress(slot: SlotView) -> tuple[int, int]:
    """(done, total): prompt tokens while prefilling, generated tokens after."""
    if slot.phase is Phase.PREFILL:
        return slot.num_computed, slot.prompt_len
    return slot.num_generated, slot.max_tokens


class SlotsPanel(Panel):
    MIN_INTERVAL_S = 0.3
    def __init__(self, *, id: str | None = "slots") -> None:
        super().__init__(id=id)
        self.timeline = False

    def content_key(self, frame: DashboardFrame) -> object:
        snap = frame.snapshot
        if snap is None:
            return None
        if self.timeline:
            return snap.step, snap.is_step, len(frame.timeline), self.timeline
        return snap.slots, snap.num_waiting > 0, snap.max_num_seqs, self.timeline

    def toggle_view(self) -> None:
        self.timeline = not self.timeline
        if self.frame is not None:
            self.update_titles(self.frame)
        self.refresh()

    def update_titles(self, frame: DashboardFrame) -> None:
        snap = frame.snapshot
        view = "timeline" if self.timeline else "grid"
        if snap is None:
            self.border_title = f"Slots · {view}"
            return
        busy = sum(1 for s in snap.slots if s.phase in (Phase.PREFILL, Phase.DECODE))
        bubbles = sum(1 for s in snap.slots if is_bubble(s, snap))
        self.border_title = f"Slots {busy}/{snap.max_num_seqs} busy · {view}"
        self.border_subtitle = f"{bubbles} bubble{'s' * (bubbles != 1)}" if bubbles else "v: grid/timeline"

    def render(self) -> Text:
        frame = self.frame
        if frame is None or frame.snapshot is None:
            return self.placeholder("waiting for the first step…")
        width, height = self.content_size.width, self.content_size.height
        if self.timeline:
            return render_timeline(self, frame, width, height)
        return self.render_grid(frame.snapshot, width, height)

    def render_grid(self, snap: StepSnapshot, width: int, height: int) -> Text:
        slots = snap.slots
        for cell_width, draw in ((DETAILED_WIDTH, self._detailed), (MEDIUM_WIDTH, self._medium),
                                 (COMPACT_WIDTH, self._compact)):
            cols = max(1, width // cell_width)
            if cols * max(1, height) >= len(slots) or cell_width == COMPACT_WIDTH:
                break
        rows = -(-len(slots) // cols)
        out = Runs()
        for r in range(min(rows, height)):
            if r:
                out.newline()
            for c in range(cols):
                i = c * rows + r  # column-major: slot numbers run down, then across
                if i < len(slots):
                    draw(out, slots[i], snap, cell_width)
        if rows > height:
            out.add(f"\n… {len(slots) - cols * height} more slots (widen the window)", self.style("muted"))
        return out.text()

    def _cell_style(self, slot: SlotView, snap: StepSnapshot) -> Style:
        if is_bubble(slot, snap):
            return self.style("background", bgcolor_var="bubble", bold=True)
        if slot.phase is Phase.EMPTY:
            return self.style("slot-empty")
        if slot.phase is Phase.PADDING:
            return self.style("phase-padding")
        return self.request_style(slot.index, bold=slot.phase is Phase.PREFILL)

    def _bar(self, out: Runs, slot: SlotView, length: int) -> None:
        done, total = progress(slot)
        filled = round(length * done / total) if total else 0
        fill = self.style("phase-padding") if slot.phase is Phase.PADDING else self.request_style(slot.index)
        out.add("█" * filled, fill)
        out.add("░" * (length - filled), self.style("slot-empty"))

    def _detailed(self, out: Runs, slot: SlotView, snap: StepSnapshot, width: int) -> None:
        style = self._cell_style(slot, snap)
        out.add(f"{slot.slot:>3} ", self.style("muted"))
        if slot.phase is Phase.EMPTY:
            label = "bubble: idle, queue waiting" if is_bubble(slot, snap) else "empty"
            out.add(f"{GLYPH[slot.phase]} {label:<{width - 7}.{width - 7}}", style)
            out.add(" ")
            return
        done, total = progress(slot)
        out.add(f"{GLYPH[slot.phase]} {slot.request_id:<8.8}", style)
        out.add(" ")
        self._bar(out, slot, 8)
        out.add(f" {done:>4}/{total:<4}" + " " * (width - 4 - 10 - 1 - 8 - 10), self.style("foreground"))

    def _medium(self, out: Runs, slot: SlotView, snap: StepSnapshot, width: int) -> None:
        style = self._cell_style(slot, snap)
        if slot.phase is Phase.EMPTY:
            out.add(f"{GLYPH[slot.phase]}{'':<{width - 2}}", style)
        else:
            out.add(f"{GLYPH[slot.phase]}{slot.request_id:<6.6}", style)
            self._bar(out, slot, width - 8)
        out.add(" ")

    def _compact(self, out: Runs, slot: SlotView, snap: StepSnapshot, width: int) -> None:
        out.add(GLYPH[slot.phase] * (width - 1), self._cell_style(slot, snap))
        out.add(" ")
