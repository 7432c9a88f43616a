"""Waiting in attach mode: the queue length, the server's waiting reasons, the preemption rate, the
queue time, and (from the verdict) what the queue waits for: the monitor's readings, laid out."""

from __future__ import annotations

import textwrap

from rich.text import Text

from batchtop.core_engine.attach.monitor import AttachFrame
from batchtop.tui.widgets.attach.format import num
from batchtop.tui.widgets.common.panel import Panel, Runs


class AttachWaitingPanel(Panel):
    def __init__(self, *, id: str | None = "attach-waiting") -> None:
        super().__init__(id=id)

    def content_key(self, frame: AttachFrame) -> object:
        return frame.tick

    def update_titles(self, frame: AttachFrame) -> None:
        self.border_title = f"Waiting {num(frame.main.waiting)} (measured)"
        self.border_subtitle = "why: derived from the gauges"

    def render(self) -> Text:
        frame: AttachFrame | None = self.frame
        if frame is None or frame.main.flavour is None:
            return self.placeholder("no sample yet")
        m = frame.main
        width = max(10, self.content_size.width)
        out = Runs()
        for line in textwrap.wrap(frame.readings.why_waiting, width)[:3]:
            out.add(line, self.style("warning", bold=True))
            out.newline()
        if m.waiting_by_reason:
            reasons = ", ".join(f"{k} {v:.0f}" for k, v in sorted(m.waiting_by_reason.items()))
            out.add(f"by reason: {reasons}", self.style("foreground"))
        else:
            out.add(f"by reason: {m.cannot_fill.get('waiting_reasons', 'not exposed')}"[:width], self.style("muted"))
        out.newline()
        trend = frame.readings.queue_trend
        out.add(f"queue trend: {'–' if trend is None else f'{trend:+.1f}/s'}", self.style("foreground"))
        out.newline()
        preempt = m.rates.get("preemptions")
        out.add(f"preemptions: {m.cannot_fill.get('preemptions', 'not exposed') if preempt is None else f'{preempt:.2f}/s'}"[:width],
                self.style("foreground"))
        out.newline()
        q = m.latency.get("queue_time", {})
        out.add(f"queue time p50/p99: {_s(q.get('p50'))} / {_s(q.get('p99'))}", self.style("foreground"))
        return out.text()


def _s(value: float | None) -> str:
    return "–" if value is None else (f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.2f} s")
