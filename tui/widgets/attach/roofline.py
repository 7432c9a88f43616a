"""The roofline in attach mode: each interval's point (intensity, achieved FLOP/s) of the live server
against the device's roofs, with a trail of recent intervals; the title says whether the point is
measured (the server's FLOP/byte counters) or estimated (token rates x the engine's FLOP/byte model)."""

from __future__ import annotations

import math

from rich.text import Text

from batchtop.core_engine.attach.monitor import AttachFrame
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.tui.widgets.common.panel import Panel, Runs
from batchtop.tui.widgets.engine.roofline import si

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
        points = [h.point for h in frame.history if h.point is not None][-TRAIL:]
        out = Runs()
        plot_h = height - 3
        if self.peaks is None and not points:
            out.add(self.peaks_note[:width * 2], self.style("muted"))
            out.newline()
        else:
            self._plot(out, points, width, plot_h)
        out.add(self.verdict(frame)[:width], self.style("foreground", bold=True))
        out.newline()
        out.add(f"roofs: {self.peaks_note}"[:width], self.style("muted"))
        return out.text()

    def _plot(self, out: Runs, points: list, width: int, plot_h: int) -> None:
        peaks = self.peaks
        xs = [p.intensity for p in points if p.intensity > 0]
        ys = [p.flops_per_s for p in points if p.flops_per_s > 0]
        ridge = peaks.ridge_flop_per_byte if peaks is not None else (xs[0] if xs else 1.0)
        x_lo = 10 ** min([math.floor(math.log10(ridge)) - 1, *(math.floor(math.log10(x)) for x in xs)])
        x_hi = 10 ** max([math.ceil(math.log10(ridge)) + 1, *(math.ceil(math.log10(x)) for x in xs)])
        y_hi = max([peaks.peak_flops * 1.5 if peaks is not None else 0.0, *(y * 10 for y in ys), 1.0])
        y_lo = min([peaks.peak_bytes_per_s * x_lo / 1.5 if peaks is not None else y_hi, *(y / 10 for y in ys)])
        lx0, lxs = math.log10(x_lo), math.log10(x_hi) - math.log10(x_lo)
        ly0, lys = math.log10(y_lo), max(1e-9, math.log10(y_hi) - math.log10(y_lo))

        def col(x: float) -> int:
            return round((math.log10(max(x, x_lo)) - lx0) / lxs * (width - 1))

        def row(y: float) -> int:
            return plot_h - 1 - round((math.log10(max(y, y_lo)) - ly0) / lys * (plot_h - 1))

        grid = [[(" ", "muted")] * width for _ in range(plot_h)]
        if peaks is not None:
            for c in range(width):
                x = 10 ** (lx0 + c / (width - 1) * lxs)
                r = row(peaks.roof(x))
                if 0 <= r < plot_h:
                    grid[r][c] = ("─" if x >= ridge else "·", "roof")
        for i, p in enumerate(points):
            r, c = row(p.flops_per_s), col(p.intensity)
            if 0 <= r < plot_h and 0 <= c < width:
                last = i == len(points) - 1
                grid[r][c] = ("●" if last else "•", "point-decode!" if last else "point-decode")
        for line in grid:
            for glyph, colour in line:
                bold = colour.endswith("!")
                out.add(glyph, self.style(colour.rstrip("!"), bold=bold, dim=colour == "point-decode"))
            out.newline()
        axis = f"{si(x_lo, 'FLOP/B')}".ljust(width // 2) + f"{si(x_hi, 'FLOP/B')}".rjust(width - width // 2)
        out.add(axis[:width], self.style("muted"))
        out.newline()
