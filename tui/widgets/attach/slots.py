"""Slots in attach mode: the running requests against the slot ceiling (max_num_seqs, when the server
or the user says it, or the plateau the verdict inferred), llama.cpp's own slots one by one when its
/slots answers, and a strip chart of running and waiting over the recent intervals. The ceiling and
the slots' states are the monitor's readings; this panel lays them out."""

from __future__ import annotations

from rich.text import Text

from batchtop.core_engine.attach.monitor import AttachFrame
from batchtop.tui.widgets.attach.format import num
from batchtop.tui.widgets.common.panel import Panel, Runs

BARS = " ▁▂▃▄▅▆▇█"


def column_glyphs(running: float, waiting: float, top: float, height: int) -> list[tuple[str, str]]:
    """One chart column, bottom row first: running stacked under waiting, in eighths of a row."""
    scale = height * 8 / top if top > 0 else 0.0
    run_eighths = round(running * scale)
    all_eighths = round((running + waiting) * scale)
    out = []
    for r in range(height):
        lo, hi = r * 8, r * 8 + 8
        if run_eighths >= hi:
            out.append(("█", "phase-decode"))
        elif all_eighths >= hi:
            out.append(("█", "bubble") if run_eighths <= lo else ("▄", "mixed"))  # running below, waiting above
        elif all_eighths > lo:
            colour = "phase-decode" if run_eighths > lo else "bubble"
            out.append((BARS[all_eighths - lo], colour))
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
        self.border_title = f"Slots: {num(m.running)} running / {num(top) if top else '?'} (measured)"
        self.border_subtitle = f"max_num_seqs {source}"

    def render(self) -> Text:
        frame: AttachFrame | None = self.frame
        if frame is None or frame.main.running is None:
            return self.placeholder("no sample yet")
        m = frame.main
        width, height = max(10, self.content_size.width), max(4, self.content_size.height)
        out = Runs()
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
        chart_h = max(1, height - 4)
        history = [h for h in frame.history if h.running is not None][-width:]
        top = max([(h.running or 0) + (h.waiting or 0) for h in history] + [float(top or 0), 1.0])
        columns = [column_glyphs(h.running or 0, h.waiting or 0, top, chart_h) for h in history]
        for r in reversed(range(chart_h)):
            for col in columns:
                glyph, colour = col[r]
                out.add(glyph, self.style("phase-decode", bgcolor_var="bubble") if colour == "mixed"
                        else self.style(colour))
            out.newline()
        out.add("█ running", self.style("phase-decode"))
        out.add(f"  █ waiting  (last {len(history)} scrapes, top {top:.0f})", self.style("bubble"))
        return out.text()
