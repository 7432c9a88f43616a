"""The attach panel set: the verdict line (what bounds the batch, and what to try), the replicas, then
slots and KV, waiting and the roofline, answered from a server's /metrics (or a recording of them),
and the metrics strip. Layout lives in the stylesheet."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical

from batchtop.core_engine.attach.monitor import AttachFrame
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.tui.widgets.attach.format import short_url
from batchtop.tui.widgets.attach.kv import AttachKVPanel
from batchtop.tui.widgets.attach.metrics_strip import AttachMetricsStrip
from batchtop.tui.widgets.attach.replicas import AttachReplicasPanel
from batchtop.tui.widgets.attach.roofline import AttachRooflinePanel
from batchtop.tui.widgets.attach.slots import AttachSlotsPanel
from batchtop.tui.widgets.attach.verdict_line import AttachVerdictLine
from batchtop.tui.widgets.attach.waiting import AttachWaitingPanel


class AttachView(Vertical):
    def __init__(self, num_replicas: int, peaks: DevicePeaks | None, peaks_note: str) -> None:
        super().__init__(id="attach-view")
        self.num_replicas = num_replicas
        self.peaks, self.peaks_note = peaks, peaks_note
        self._panels: list = []

    def compose(self) -> ComposeResult:
        yield AttachVerdictLine(id="attach-verdict")
        yield AttachReplicasPanel()
        with Horizontal(id="attach-top"):
            yield AttachSlotsPanel()
            yield AttachKVPanel()
        with Horizontal(id="attach-bottom"):
            yield AttachWaitingPanel()
            yield AttachRooflinePanel(self.peaks, self.peaks_note)
        yield AttachMetricsStrip(id="attach-metrics")

    def on_mount(self) -> None:
        self._panels = [self.query_one(p) for p in (AttachReplicasPanel, AttachSlotsPanel, AttachKVPanel,
                                                     AttachWaitingPanel, AttachRooflinePanel)]
        self._metrics = self.query_one(AttachMetricsStrip)
        self._verdict = self.query_one(AttachVerdictLine)
        rows = self.num_replicas
        self.query_one(AttachReplicasPanel).styles.height = min(14, 3 + rows + (2 if rows > 1 else 0))

    def on_unmount(self) -> None:
        self._panels = []

    @property
    def ready(self) -> bool:
        return bool(self._panels)

    def show(self, frame: AttachFrame | None, force: bool = False) -> None:
        if not self._panels or frame is None:
            return
        self._verdict.show(frame)
        for panel in self._panels:
            panel.show(frame, force)
        self._metrics.show(frame)

    def status_line(self, frame: AttachFrame | None, extra: str) -> tuple[Text, int]:
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(" batchtop attach ", "bold reverse")
        if frame is not None:
            m = frame.main
            what = frame.readings.server
            where = short_url(frame.replicas[0].name) if len(frame.replicas) == 1 else f"{len(frame.replicas)} replicas"
            text.append(f" {what} · {where} · {m.model_name or '?'} ", "bold")
            text.append(f"│ {m.status} ")
        text.append(f"│ {extra} ")
        if frame is not None:
            text.append(f"│ scrape {frame.tick} · t {frame.t:.0f}s")
        else:
            text.append("│ waiting for the first scrape")
        return text, text.cell_len

    def repaint_after_theme_change(self) -> None:
        for panel in self._panels:
            panel.refresh()
