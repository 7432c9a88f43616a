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
from batchtop.core_engine.engine.snapshot import SlotState, SlotView
from batchtop.core_engine.run.frame import DashboardFrame
from batchtop.tui.widgets.common.text_fit import first_fit, pad
from batchtop.tui.widgets.common.panel import Panel, Runs
from batchtop.tui.widgets.engine.slot_count import SlotCount, SlotRole, count_slots
from batchtop.tui.widgets.engine.slot_look import DRAINING_GLYPH, GRID_GLYPH, add_legend, text_tail
from batchtop.tui.widgets.engine.slot_timeline import (COMPACT_LABEL_WIDTH, compact_legend, render_compact_timeline,
                                                       render_timeline)

DETAILED_WIDTH, MEDIUM_WIDTH, COMPACT_WIDTH = 34, 13, 3
TEXT_WIDTH = 60  # a detailed cell and the tail of its request's text
MIN_TIMELINE_ROWS = 2  # below this, the grid keeps the panel to itself


def progress(slot: SlotView) -> tuple[int, int]:
    """(done, total): prompt tokens while prefilling, generated tokens after."""
    if slot.phase is Phase.PREFILL:
        return slot.num_computed, slot.prompt_len
    return slot.num_generated, slot.max_tokens


VACANT_LABEL = {SlotRole.HELD: "held for a draining seq", SlotRole.RETIRED: "past max_num_seqs"}


def cut_note(shown: int, count: SlotCount, width: int) -> str:
    """What a view that cannot show every slot says on its last row."""
    long = f"slots 0-{shown - 1} of {count.range_label()} shown · v: every slot, ↑↓ to scroll"
    draining = [f"slots 0-{shown - 1} of {count.range_label()} · v: all"] if count.draining else []
    return first_fit([long, *draining, f"{shown} of {count.rows} slots · v: all"], width)


def grid_cut_note(shown: int, count: SlotCount, width: int) -> str:
    shown_of = f"… slots 0-{shown - 1} of {count.range_label()} shown"
    return first_fit([f"{shown_of}: v shows every slot (or widen the window)", f"{shown_of}: v shows every slot",
                      f"… {shown} of {count.rows} slots · v: all"], width)


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
        # it are free now, shown ✓ for this one frame; busy counts only the max_num_seqs slots, never past them
        count = count_slots(snap)
        draining = f" · {count.draining} draining" if count.draining else ""
        room = self.title_room()
        self.border_title = first_fit([f"Slots {count.busy}/{count.limit} busy{draining} · {view}",
                                       f"Slots {count.busy}/{count.limit} busy{draining}"], room)
        notes = [f"{n} {name}{'s' * (n != 1)}" for n, name in ((count.padding, "padding row"),
                                                             (count.bubbles, "bubble")) if n]
        notes += [f"{count.finished} finished"] if count.finished else []
        notes += [f"{DRAINING_GLYPH} past max_num_seqs={count.limit}: running to the end"] if count.draining else []
        long = " · ".join(notes) if notes else "v: grid/timeline"
        self.border_subtitle = first_fit([long, long.replace(": running to the end", "")], room)

    def render(self) -> Text:
        frame = self.frame
        if frame is None or frame.snapshot is None:
            return self.placeholder("waiting for the first step…")
        snap = frame.snapshot
        count = count_slots(snap)
        width, height = self.content_size.width, self.content_size.height
        self._layout = None
        if self.timeline:
            text, self.timeline_top = render_timeline(self, frame.timeline, count, width, height, self.timeline_top)
            return text
        out = Runs()
        grid_rows = self.render_grid(out, snap.slots[:count.rows], count, width, height)
        spare = height - grid_rows - 1  # one row for the timeline's caption
        if spare >= MIN_TIMELINE_ROWS and frame.timeline:
            steps = min(len(frame.timeline), max(1, width - COMPACT_LABEL_WIDTH))
            rows = spare if 2 * spare >= count.rows else spare - 1  # keep a row to say what is cut
            out.newline()
            self._caption(out, f"─ last {steps} steps ", compact_legend(self, frame.timeline, count, width, rows),
                          width)
            shown = render_compact_timeline(self, out, frame.timeline, count, width, rows)
            if shown < count.rows:
                out.newline()
                out.add(cut_note(shown, count, width), self.style("warning"))
        return out.text()

    def _caption(self, out: Runs, head: str, legend: list, width: int) -> None:
        """The compact timeline's caption: "─ last 14 steps ", the legend of its colours, a rule to the edge."""
        muted = self.style("muted")
        head = head[:width]
        out.add(head, muted)
        used = len(head)
        if legend and width - used > 2:
            used += add_legend(self, out, legend, width - used - 2)
            out.add(" ", muted)
            used += 1
        out.add("─" * max(0, width - used), muted)

    def render_grid(self, out: Runs, slots: tuple[SlotView, ...], count: SlotCount, width: int, height: int) -> int:
        """Draw the grid into out, as compact as the slots allow; returns the rows it took."""
        states = self.frame.snapshot.slot_states()
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
        drawn = rows if rows <= height else max(0, height - 1)  # a cut grid keeps its last row to say so
        for r in range(drawn):
            if r:
                out.newline()
            for c in range(cols):
                i = c * rows + r
                if i < len(slots):
                    draw(out, slots[i], states[i], count.roles[i], cell_width)
        if rows > height:
            shown = sum(1 for c in range(cols) for r in range(drawn) if c * rows + r < len(slots))
            out.add(("\n" if drawn else "") + grid_cut_note(shown, count, width), self.style("warning"))
            return height
        return rows

    def _cell_style(self, slot: SlotView, state: SlotState, role: SlotRole) -> Style:
        if role is SlotRole.DRAINING:
            return self.request_style(slot.index, bold=slot.phase is Phase.PREFILL, bgcolor_var="draining")
        if role is SlotRole.HELD:
            return self.style("muted", bgcolor_var="draining")
        if state is SlotState.BUBBLE:
            return self.style("background", bgcolor_var="bubble", bold=True)
        if state is SlotState.PADDING:
            return self.style("phase-padding")
        if state is SlotState.FREE:
            return self.style("slot-empty")
        return self.request_style(slot.index, bold=slot.phase is Phase.PREFILL)

    @staticmethod
    def _glyph(slot: SlotView, role: SlotRole) -> str:
        return " " if role is SlotRole.RETIRED else GRID_GLYPH[slot.phase]

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

    def _marker(self, out: Runs, role: SlotRole) -> None:
        """The cell after the slot number: ↓ on a draining slot (past max_num_seqs), else a space."""
        if role is SlotRole.DRAINING:
            out.add(DRAINING_GLYPH, self.style("foreground", bgcolor_var="draining"))
        else:
            out.add(" ", self.style("muted"))

    def _detailed(self, out: Runs, slot: SlotView, state: SlotState, role: SlotRole, width: int) -> None:
        style = self._cell_style(slot, state, role)
        out.add(f"{slot.slot:>3}", self._selected(slot, self.style("muted")))
        self._marker(out, role)
        if slot.request_id is None:
            label = VACANT_LABEL.get(role) or ("bubble: idle, queue waiting" if state is SlotState.BUBBLE else "empty")
            out.add(f"{self._glyph(slot, role)} {pad(label, width - 7)}", style)
            out.add(" ")
            return
        done, total = progress(slot)
        out.add(f"{GRID_GLYPH[slot.phase]} {pad(slot.request_id, 8, keep_end=True)}", style)
        out.add(" ")
        self._bar(out, slot, state, 8)
        out.add(f" {done:>4}/{total:<4}" + " " * (width - 4 - 10 - 1 - 8 - 10), self.style("foreground"))

    def _with_text(self, out: Runs, slot: SlotView, state: SlotState, role: SlotRole, width: int) -> None:
        """The detailed cell, then the end of the request's output (of its prompt before any output)."""
        self._detailed(out, slot, state, role, DETAILED_WIDTH)
        text = self.frame.texts.get(slot.index) if slot.request_id is not None else None
        shown, style = "", self.style("foreground")
        if text is not None:
            shown, style = (text.output, style) if text.output else (text.prompt, self.style("muted"))
        out.add(text_tail(shown, width - DETAILED_WIDTH - 1), style)
        out.add(" ")

    def _medium(self, out: Runs, slot: SlotView, state: SlotState, role: SlotRole, width: int) -> None:
        style = self._cell_style(slot, state, role)
        glyph = DRAINING_GLYPH if role is SlotRole.DRAINING else self._glyph(slot, role)
        out.add(glyph, self._selected(slot, style))
        if slot.request_id is None:
            out.add(" " * (width - 2), style)
        else:
            out.add(pad(slot.request_id, 6, keep_end=True), style)
            self._bar(out, slot, state, width - 8)
        out.add(" ")

    def _compact(self, out: Runs, slot: SlotView, state: SlotState, role: SlotRole, width: int) -> None:
        glyphs = self._glyph(slot, role) * (width - 1)
        if role is SlotRole.DRAINING:
            glyphs = DRAINING_GLYPH + glyphs[1:]
        out.add(glyphs, self._selected(slot, self._cell_style(slot, state, role)))
        out.add(" ")
