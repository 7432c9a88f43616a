"""The replicas panel: one row per server (its health, load and latency), the aggregate of several,
and the imbalance line that names the replica out of line with the others."""

from __future__ import annotations

from rich.text import Text

from batchtop.core_engine.attach.monitor import AttachFrame
from batchtop.core_engine.attach.scrape.scrape import LIVE
from batchtop.core_engine.attach.stats import ReplicaStats
from batchtop.tui.widgets.attach.format import latency, num, pct, secs, short_url
from batchtop.tui.widgets.common.panel import Panel, Runs

STATUS_COLOUR = {LIVE: "success", "STALE": "warning", "DOWN": "error", "BAD": "error"}
COLUMNS = f"{'#':>2} {'server':<24} {'kind':<8} {'health':<6} {'run':>5} {'wait':>5} {'KV':>5} " \
          f"{'gen tok/s':>9} {'TTFT p95':>8}"


class AttachReplicasPanel(Panel):
    def __init__(self, *, id: str | None = "attach-replicas") -> None:
        super().__init__(id=id)

    def content_key(self, frame: AttachFrame) -> object:
        return frame.tick

    def update_titles(self, frame: AttachFrame) -> None:
        live = sum(s.status == LIVE for s in frame.replicas)
        self.border_title = f"Replicas {live}/{len(frame.replicas)} live"
        self.border_subtitle = "data-parallel: summed, histograms merged" if len(frame.replicas) > 1 else ""

    def _row(self, out: Runs, index: str, s: ReplicaStats) -> None:
        stale = s.status != LIVE
        base = self.style("muted") if stale else self.style("foreground")
        out.add(f"{index:>2} {short_url(s.name)[:24]:<24} {(s.flavour or '?'):<8} ", base)
        out.add(f"{s.status:<6}", self.style(STATUS_COLOUR.get(s.status, "muted"), bold=True))
        out.add(f" {num(s.running):>5} {num(s.waiting):>5} {pct(s.kv_usage):>5} "
                f"{num(s.rates.get('generation_tokens')):>9} {secs(latency(s, 'ttft', 'p95')):>8}", base)
        notes = [s.reason] if s.reason else []
        if s.note:
            notes.append(s.note)
        if s.resets:
            notes.append(f"counters reset x{s.resets} (restart): rates restarted")
        if notes:
            out.add("  " + "; ".join(notes), self.style("warning" if stale else "muted"))
        out.newline()

    def render(self) -> Text:
        frame: AttachFrame | None = self.frame
        if frame is None:
            return self.placeholder("no scrape yet")
        out = Runs()
        out.add(COLUMNS, self.style("muted", bold=True))
        out.newline()
        for i, s in enumerate(frame.replicas):
            self._row(out, str(i), s)
        if len(frame.replicas) > 1:
            self._row(out, "Σ", frame.aggregate)
            line = frame.readings.imbalance
            if line is None:
                out.add("balanced: no replica 50% off the mean in running, waiting, KV or TTFT p95",
                        self.style("muted"))
            else:
                out.add(line.line(), self.style("warning", bold=True))
        return out.text()
