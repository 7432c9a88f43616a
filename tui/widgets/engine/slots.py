"""The Slots panel: who holds each of max_num_seqs slots, in which phase, how far along, and under the
grid the recent history of every slot as a compact timeline.

Bubbles — an empty or idle slot while requests wait — are drawn on the $bubble colour, so the slots a
policy leaves unused are the first thing the eye finds; static batching's finished rows, still
computed, are padding. Both come from the engine's one definition of slot states. `v` gives the whole
panel to the timeline (tui.widgets.slot_timeline).

With a model directory's tokenizer each cell also shows the tail of its request's output (its prompt
while that is prefilled), when the panel is wide enough. Arrow keys move a selection over the slots,
enter (or a click) opens the request in a detail view (tui.screens.request_detail).
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual import events
from textual.message import Message

from batchtop.core_engine.sched.request import Phase
from batchtop.core_engine.engine.snapshot import WORKING_PHASES, SlotState, SlotView, StepSnapshot
from batchtop.tui.sources.frame import DashboardFrame
from batchtop.tui.widgets.common.panel import Panel, Runs
from batchtop.tui.widgets.engine.slot_look import GRID_GLYPH, text_tail
from batchtop.tui.widgets.engine.slot_timeline import COMPACT_LABEL_WIDTH, render_compact_timeline, render_timeline

DETAILED_WIDTH, MEDIUM_WIDTH, COMPACT_WIDTH = 34, 13, 3
TEXT_WIDTH = 60  # a detailed cell and the tail of its request's text
MIN_TIMELINE_ROWS = 2  # below this, the grid keeps the panel to itself


def progress(slot: SlotView) -> tuple[int, int]:
    """(done, total): prompt tokens while prefilling, generated tokens after."""
    if slot.phase is Phase.PREFILL:
        return slot.num_computed, slot.prompt_len
    return slot.num_generated, slot.max_tokens


def cut_note(shown: int, total: int, width: int) -> str:
    """What a view that cannot show every slot says on its last row."""
    note = f"slots 0-{shown - 1} of {total} shown · v: every slot, ↑↓ to scroll"
    return note if len(note) <= width else f"{shown} of {total} slots · v: all"[:width]


class SlotsPanel(Panel):
    class Chosen(Message):
        """A slot was clicked, or chosen with enter: show its request."""

        def __init__(self, slot: SlotView) -> None:
            super().__init__()
            self.slot = slot

    def __init__(self, *, id: str | None = "slots") -> None:
        super().__init__(id=id)
        self.timeline = False
        self.selected: int | None = None  # the slot the arrow keys move; None until one is pressed
        self.timeline_top = 0  # the first slot the full timeline shows (the arrow keys scroll it)
        self._layout: tuple[int, int, int] | None = None  # columns, rows, cell width of the grid last drawn

    def content_key(self, frame: DashboardFrame) -> object:
        snap = frame.snapshot
        if snap is None:
            return None
        texts = tuple(frame.texts.get(s.index) for s in snap.slots) if frame.texts else ()
        return (snap.slots, snap.slot_states(), snap.max_num_seqs, len(frame.timeline), snap.step, self.timeline,
                self.selected, texts, self.timeline_top)

    # -- choosing a slot --------------------------------------------------------------------------
    def move_selection(self, rows: int, columns: int) -> None:
        """Arrow keys: slots run down the grid's columns, then across."""
        snap = self.frame.snapshot if self.frame is not None else None
        if snap is None or not snap.slots:
            return
        if self.timeline:  # up/down one slot, left/right a page
            self.scroll_timeline(rows + columns * max(1, self.content_size.height - 2))
            return
        if self.selected is None:
            self.selected = 0
        else:
            grid_rows = self._layout[1] if self._layout is not None else len(snap.slots)
            self.selected = min(max(self.selected + rows + columns * grid_rows, 0), len(snap.slots) - 1)
        self.refresh()

    def selected_slot(self) -> SlotView | None:
        snap = self.frame.snapshot if self.frame is not None else None
        if snap is None or self.selected is None or self.selected >= len(snap.slots):
            return None
        return snap.slots[self.selected]

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or self._layout is None or self.timeline or self.frame is None:
            return
        columns, rows, cell_width = self._layout
        column, row = offset.x // cell_width, offset.y
        slot = column * rows + row
        if column < columns and row < rows and self.frame.snapshot and slot < len(self.frame.snapshot.slots):
            self.selected = slot
            self.refresh()
            self.post_message(self.Chosen(self.frame.snapshot.slots[slot]))

    def scroll_timeline(self, rows: int) -> None:
        """The full timeline shows as many slots as there are rows: the arrow keys move through the rest."""
        self.timeline_top = max(0, self.timeline_top + rows)
        self.refresh()

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
        # the title counts the slots as the step leaves them (the block map's moment): those that finished in
        # it are free now, shown ✓ for this one frame
        phases = [s.phase for s in snap.slots]
        busy = sum(p in WORKING_PHASES for p in phases)
        padding, finished = phases.count(Phase.PADDING), phases.count(Phase.FINISHED)
        bubbles = snap.slot_states().count(SlotState.BUBBLE)
        self.border_title = f"Slots {busy}/{snap.max_num_seqs} busy · {view}"
        notes = [f"{n} {name}{'s' * (n != 1)}" for n, name in ((padding, "padding row"), (bubbles, "bubble")) if n]
        notes += [f"{finished} finished"] if finished else []
        self.border_subtitle = " · ".join(notes) if notes else "v: grid/timeline"

    def render(self) -> Text:
        frame = self.frame
        if frame is None or frame.snapshot is None:
            return self.placeholder("waiting for the first step…")
        snap = frame.snapshot
        width, height = self.content_size.width, self.content_size.height
        self._layout = None
        if self.timeline:
            text, self.timeline_top = render_timeline(self, frame.timeline, len(snap.slots), width, height,
                                                      self.timeline_top)
            return text
        out = Runs()
        grid_rows = self.render_grid(out, snap, width, height)
        spare = height - grid_rows - 1  # one row for the timeline's caption
        if spare >= MIN_TIMELINE_ROWS and frame.timeline:
            num_slots = max([len(snap.slots)] + [len(col) for col in frame.timeline])
            steps = min(len(frame.timeline), max(1, width - COMPACT_LABEL_WIDTH))
            out.newline()
            out.add(f"─ last {steps} steps " .ljust(width, "─")[:width], self.style("muted"))
            rows = spare if 2 * spare >= num_slots else spare - 1  # keep a row to say what is cut
            shown = render_compact_timeline(self, out, frame.timeline, num_slots, width, rows)
            if shown < num_slots:
                out.newline()
                out.add(cut_note(shown, num_slots, width), self.style("warning"))
        return out.text()

    def render_grid(self, out: Runs, snap: StepSnapshot, width: int, height: int) -> int:
        """Draw the grid into out, as compact as the slots allow; returns the rows it took."""
        slots, states = snap.slots, snap.slot_states()
        cells = ((TEXT_WIDTH, self._with_text),) if self.frame.texts else ()
        for cell_width, draw in (*cells, (DETAILED_WIDTH, self._detailed), (MEDIUM_WIDTH, self._medium),
                                 (COMPACT_WIDTH, self._compact)):
            cols = max(1, width // cell_width)
            if cols * max(1, height) >= len(slots) or cell_width == COMPACT_WIDTH:
                break
        rows = -(-len(slots) // cols)
        self._layout = (cols, rows, cell_width)
        # slot numbers run down, then across; at most two columns deep as long as it fits, so the
        # rest of the panel is left to the timeline
        for r in range(min(rows, height)):
            if r:
                out.newline()
            for c in range(cols):
                i = c * rows + r
                if i < len(slots):
                    draw(out, slots[i], states[i], cell_width)
        if rows > height:
            out.add(f"\n… slots 0-{cols * height - 1} of {len(slots)} shown: v shows every slot (or widen the window)"
                    [:width + 1], self.style("warning"))
            return height + 1
        return rows

    def _cell_style(self, slot: SlotView, state: SlotState) -> Style:
        if state is SlotState.BUBBLE:
            return self.style("background", bgcolor_var="bubble", bold=True)
        if state is SlotState.PADDING:
            return self.style("phase-padding")
        if state is SlotState.FREE:
            return self.style("slot-empty")
        return self.request_style(slot.index, bold=slot.phase is Phase.PREFILL)

    def _bar(self, out: Runs, slot: SlotView, state: SlotState, length: int) -> None:
        done, total = progress(slot)
        pad = slot.num_prompt_padding
        if pad:  # a padded prompt: its pad tokens show ahead of the prompt, in their own colour
            padded = round(length * pad / (pad + total))
            out.add("▒" * padded, self.style("prompt-pad"))
            length -= padded
        filled = round(length * done / total) if total else 0
        fill = self.style("phase-padding") if state is SlotState.PADDING else self.request_style(slot.index)
        out.add("█" * filled, fill)
        out.add("░" * (length - filled), self.style("slot-empty"))

    def _selected(self, slot: SlotView, style: Style) -> Style:
        return self.style("foreground", reverse=True) if slot.slot == self.selected else style

    def _detailed(self, out: Runs, slot: SlotView, state: SlotState, width: int) -> None:
        style = self._cell_style(slot, state)
        out.add(f"{slot.slot:>3}", self._selected(slot, self.style("muted")))
        out.add(" ", self.style("muted"))
        if slot.request_id is None:
            label = "bubble: idle, queue waiting" if state is SlotState.BUBBLE else "empty"
            out.add(f"{GRID_GLYPH[slot.phase]} {label:<{width - 7}.{width - 7}}", style)
            out.add(" ")
            return
        done, total = progress(slot)
        out.add(f"{GRID_GLYPH[slot.phase]} {slot.request_id:<8.8}", style)
        out.add(" ")
        self._bar(out, slot, state, 8)
        out.add(f" {done:>4}/{total:<4}" + " " * (width - 4 - 10 - 1 - 8 - 10), self.style("foreground"))

    def _with_text(self, out: Runs, slot: SlotView, state: SlotState, width: int) -> None:
        """The detailed cell, then the end of the request's output (of its prompt before any output)."""
        self._detailed(out, slot, state, DETAILED_WIDTH)
        text = self.frame.texts.get(slot.index) if slot.request_id is not None else None
        shown, style = "", self.style("foreground")
        if text is not None:
            shown, style = (text.output, style) if text.output else (text.prompt, self.style("muted"))
        out.add(text_tail(shown, width - DETAILED_WIDTH - 1), style)
        out.add(" ")

    def _medium(self, out: Runs, slot: SlotView, state: SlotState, width: int) -> None:
        style = self._cell_style(slot, state)
        glyph = self._selected(slot, style)
        if slot.request_id is None:
            out.add(GRID_GLYPH[slot.phase], glyph)
            out.add(f"{'':<{width - 2}}", style)
        else:
            out.add(GRID_GLYPH[slot.phase], glyph)
            out.add(f"{slot.request_id:<6.6}", style)
            self._bar(out, slot, state, width - 8)
        out.add(" ")

    def _compact(self, out: Runs, slot: SlotView, state: SlotState, width: int) -> None:
        out.add(GRID_GLYPH[slot.phase] * (width - 1), self._selected(slot, self._cell_style(slot, state)))
        out.add(" ")
