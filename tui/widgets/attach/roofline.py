"""The roofline in attach mode: each interval's point (intensity, achieved FLOP/s) of the live server
against the device's roofs, with a trail of recent intervals; the title says whether the point is
measured (the server's FLOP/byte counters) or estimated (token rates x the engine's FLOP/byte model)."""

from __future__ import annotations

from rich.text import Text

from batchtop.core_engine.attach.monitor import AttachFrame
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.tui.widgets.common.panel import Panel, Runs
from batchtop.tui.widgets.common.roofline_plot import PlotPoint, roofline_plot
from batchtop.tui.widgets.common.units import si

TRAIL = 30


class AttachRooflinePanel(Panel):
    def __init__(self, peaks: DevicePeaks | None, peaks_note: str, *, id: str | None = "attach-roofline") -> None:
        super().__init__(id=id)
        self.peaks = peaks
        self.peaks_note = peaks_note

    def content_key(self, frame: AttachFrame) -> object:
        return frame.tick

    def update_titles(self, frame: AttachFrame) -> None:
        point = frame.main.point
        how = "no point" if point is None else point.source
        self.border_title = f"Roofline ({how})"
        self.border_subtitle = (f"ridge {self.peaks.ridge_flop_per_byte:.1f} FLOP/B" if self.peaks is not None
                                else "roofs unknown")

    def verdict(self, frame: AttachFrame) -> str:
        m = frame.main
        p = m.point
        if p is None:
            return m.point_note or "no interval yet"
        text = f"{p.intensity:.1f} FLOP/B · {si(p.flops_per_s, 'FLOP/s')} ({p.source})"
        if self.peaks is not None:
            text += f": {p.bound(self.peaks)}, {100 * p.fraction_of_roof(self.peaks):.2g}% of the roof"
        return text

    def render(self) -> Text:
        frame: AttachFrame | None = self.frame
        if frame is None:
            return self.placeholder("no scrape yet")
        width, height = max(10, self.content_size.width), max(4, self.content_size.height)
        points = [PlotPoint(h.point.intensity, h.point.flops_per_s) for h in frame.history if h.point is not None]
        out = Runs()
        if self.peaks is None and not points:
            out.add(self.peaks_note[:width * 2], self.style("muted"))
            out.newline()
        else:
            for line in roofline_plot(self.peaks, points[-TRAIL:], width, height - 2):
                self.add_cells(out, line)
                out.newline()
        out.add(self.verdict(frame)[:width], self.style("foreground", bold=True))
        out.newline()
        out.add(f"roofs: {self.peaks_note}"[:width], self.style("muted"))
        return out.text()
