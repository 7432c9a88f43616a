"""Slots in attach mode: the running requests against the slot ceiling (max_num_seqs, when the server
or the user says it, or the plateau the verdict inferred), llama.cpp's own slots one by one when its
/slots answers, and a strip chart of running and waiting over the recent intervals, or, with the
server's step log (--vllm-log), one column per real engine step: its prefill and decode rows. The ceiling and
the slots' states are the monitor's readings; this panel lays them out."""

from __future__ import annotations

from rich.text import Text

from batchtop.core_engine.attach.monitor import AttachFrame
from batchtop.core_engine.attach.streams.step_log import StepLogView
from batchtop.tui.widgets.attach.format import num
from batchtop.tui.widgets.common.text_fit import clip
from batchtop.tui.widgets.common.panel import Panel, Runs

BARS = " ▁▂▃▄▅▆▇█"


def column_glyphs(lower: float, upper: float, top: float, height: int, colours: tuple[str, str] = ("phase-decode", "bubble")
                  ) -> list[tuple[str, str]]:
    """One chart column, bottom row first: `lower` stacked under `upper` (running under waiting, or decode
    rows under prefill rows), in eighths of a row; "mixed" is a cell with the lower one's top in it."""
    below, above = colours
    scale = height * 8 / top if top > 0 else 0.0
    low_eighths = round(lower * scale)
    all_eighths = round((lower + upper) * scale)
    out = []
    for r in range(height):
        lo, hi = r * 8, r * 8 + 8
        if low_eighths >= hi:
            out.append(("█", below))
        elif all_eighths >= hi:
            out.append(("█", above) if low_eighths <= lo else ("▄", "mixed"))
        elif all_eighths > lo:
            out.append((BARS[all_eighths - lo], below if low_eighths > lo else above))
        else:
            out.append((" ", "muted"))
    return out


class AttachSlotsPanel(Panel):
    def __init__(self, *, id: str | None = "attach-slots") -> None:
        super().__init__(id=id)

    def content_key(self, frame: AttachFrame) -> object:
        return frame.tick

    def update_titles(self, frame: AttachFrame) -> None:
        m = frame.main
        top, source = frame.readings.ceiling, frame.readings.ceiling_source
        steps = frame.streams.steps if frame.streams is not None else None
        logged = f" · {steps.total:,} steps logged" if steps is not None else ""
        self.border_title = f"Slots: {num(m.running)} running / {num(top) if top else '?'} (measured){logged}"
        self.border_subtitle = f"max_num_seqs {source}"

    def render(self) -> Text:
        frame: AttachFrame | None = self.frame
        if frame is None or frame.main.running is None:
            return self.placeholder("no sample yet")
        width, height = max(10, self.content_size.width), max(4, self.content_size.height)
        out = Runs()
        self._slot_row(out, frame, width)
        steps = frame.streams.steps if frame.streams is not None else None
        if steps is not None and steps.steps:
            self._step_chart(out, steps, frame.readings.ceiling, width, max(1, height - 5))
        else:
            self._scrape_chart(out, frame, width, max(1, height - 4))
        return out.text()

    def _slot_row(self, out: Runs, frame: AttachFrame, width: int) -> None:
        m = frame.main
        running = int(m.running or 0)
        top, source = frame.readings.ceiling, frame.readings.ceiling_source
        if m.slots:
            label = frame.readings.slots_line
            for busy in frame.readings.busy_slots[:width * 2]:
                out.add("●" if busy else "·", self.style("phase-decode", bold=True) if busy else self.style("slot-empty"))
            out.newline()
        elif top:
            cells = min(top, width * 2)
            per = max(1, -(-top // cells))
            filled = min(cells, -(-running // per))
            out.add("●" * filled, self.style("phase-decode", bold=True))
            out.add("·" * (cells - filled), self.style("slot-empty"))
            out.newline()
            label = f"{running}/{top} slots busy" + (f" ({per} per cell)" if per > 1 else "") + \
                (" (ceiling inferred)" if source.startswith("inferred") else "")
        else:
            out.add("●" * min(running, width), self.style("phase-decode", bold=True))
            out.newline()
            label = f"{running} running; give --max-num-seqs ({m.cannot_fill.get('ceiling', 'the ceiling is unknown')})"
        out.add(label[:width], self.style("muted"))
        out.newline()

    def _columns(self, out: Runs, columns: list[list[tuple[str, str]]], colours: tuple[str, str], rows: int) -> None:
        below, above = colours
        for r in reversed(range(rows)):
            for col in columns:
                glyph, colour = col[r]
                out.add(glyph, self.style(below, bgcolor_var=above) if colour == "mixed" else self.style(colour))
            out.newline()

    def _scrape_chart(self, out: Runs, frame: AttachFrame, width: int, rows: int) -> None:
        history = [h for h in frame.history if h.running is not None][-width:]
        top = max([(h.running or 0) + (h.waiting or 0) for h in history] + [float(frame.readings.ceiling or 0), 1.0])
        colours = ("phase-decode", "bubble")
        self._columns(out, [column_glyphs(h.running or 0, h.waiting or 0, top, rows, colours) for h in history],
                      colours, rows)
        out.add("█ running", self.style("phase-decode"))
        out.add(f"  █ waiting  (last {len(history)} scrapes, top {top:.0f})", self.style("bubble"))

    def _step_chart(self, out: Runs, view: StepLogView, ceiling: int | None, width: int, rows: int) -> None:
        """One column per step the server logged: its decode rows under its prefill rows."""
        shown = view.steps[-width:]
        top = max([s.step.rows for s in shown] + [float(ceiling or 0), 1.0])
        colours = ("phase-decode", "phase-prefill")
        out.add(clip(step_line(view), width), self.style("foreground", bold=True))
        out.newline()
        self._columns(out, [column_glyphs(s.step.decode_rows, s.step.prefill_rows, top, rows, colours)
                            for s in shown], colours, rows)
        out.add("█ decode rows", self.style("phase-decode"))
        out.add("  █ prefill rows", self.style("phase-prefill"))
        out.add(clip(f"  (last {len(shown)} logged steps, top {top:.0f})", max(0, width - 29)), self.style("muted"))


def step_line(view: StepLogView) -> str:
    """The newest logged step in words, with the real step rate and how busy the engine was."""
    newest = view.newest.step
    parts = []
    if newest.prefill_rows:
        parts.append(f"{newest.prefill_rows} prefill ({newest.prefill_tokens} tok)")
    if newest.decode_rows:
        parts.append(f"{newest.decode_rows} decode")
    what = " + ".join(parts) or "empty"
    name = f"step {newest.iteration}" if newest.iteration is not None else "batch"
    took = f" · {1000 * newest.elapsed_s:.1f} ms" if newest.elapsed_s is not None else ""
    rate = f" · {view.steps_per_s:.1f} steps/s" if view.steps_per_s is not None else ""
    busy = f" · busy {100 * view.busy_share:.0f}%" if view.busy_share is not None else ""
    sampled = " (sampled: SGLang logs every 40th decode batch)" if newest.sampled else ""
    return f"{name}: {what}{took}{rate}{busy}{sampled}"
