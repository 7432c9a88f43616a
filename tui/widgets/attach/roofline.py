"""The roofline in attach mode: each interval's point (intensity, achieved FLOP/s) of the live server
against the device's roofs, with a trail of recent intervals; the title says whether the point is
measured (the server's FLOP/byte counters) or estimated (token rates x the engine's FLOP/byte model).
With the server's step log (--vllm-log), a point per real step instead: its own tokens priced by the
engine's FLOP/byte model over its own elapsed time. A point above the roof is drawn as ↑ and counted
under the plot; no line is cut without "…"."""

from __future__ import annotations

from rich.text import Text

from batchtop.core_engine.attach.monitor import AttachFrame
from batchtop.core_engine.perf.roofline_point import RooflinePoint
from batchtop.core_engine.perf.device_peaks import DevicePeaks, format_rate
from batchtop.core_engine.perf.roofline import device_regime
from batchtop.tui.widgets.common.text_fit import clip
from batchtop.tui.widgets.common.panel import Panel, Runs
from batchtop.tui.widgets.common.roofline_plot import Plot, PlotPoint, roofline_plot
from batchtop.tui.widgets.common.wrap import wrap_lines

TRAIL = 30
DEPTH = 30.0  # the y axis reaches this far under the memory roof: a busy server can sit a decade under it
MIN_PLOT_ROWS = 4  # the plot keeps this many rows (and its axis) however long the text under it


class AttachRooflinePanel(Panel):
    def __init__(self, peaks: DevicePeaks | None, peaks_note: str, *, id: str | None = "attach-roofline") -> None:
        super().__init__(id=id)
        self.peaks = peaks
        self.peaks_note = peaks_note

    def content_key(self, frame: AttachFrame) -> object:
        return frame.tick

    @staticmethod
    def step_points(frame: AttachFrame) -> list[RooflinePoint]:
        """The logged steps' points, newest last (none without --vllm-log, or a model to price them by)."""
        steps = frame.streams.steps if frame.streams is not None else None
        return [s.point for s in steps.steps[-TRAIL:] if s.point is not None] if steps is not None else []

    def update_titles(self, frame: AttachFrame) -> None:
        steps = self.step_points(frame)
        point = steps[-1] if steps else frame.main.point
        how = "no point" if point is None else point.source
        self.border_title = f"Roofline ({how})"
        self.border_subtitle = (f"ridge {self.peaks.ridge_flop_per_byte:.1f} FLOP/B" if self.peaks is not None
                                else "roofs unknown")

    def verdict(self, frame: AttachFrame) -> str:
        m = frame.main
        steps = self.step_points(frame)
        p = steps[-1] if steps else m.point
        if p is None:
            return m.point_note or "no interval yet"
        text = f"{'step: ' if steps else ''}{p.intensity:.1f} FLOP/B · {format_rate(p.flops_per_s, 'FLOP/s')} ({p.source})"
        if self.peaks is not None:
            percent = 100 * p.fraction_of_roof(self.peaks)
            regime = device_regime(p.bound(self.peaks), self.peaks.ridge_flop_per_byte)
            here, gpu = regime or ("", "")  # where this device's ridge is what makes it compute-bound
            text += f": {p.bound(self.peaks)}{here}, {percent:{'.2g' if percent < 100 else '.0f'}}% of the roof"
            text += f" · {gpu}" if gpu else ""
        return text

    def marks_note(self, plot: Plot, what: str) -> str:
        """Why points sit above the roof (or under the axes), "" with none."""
        marks = plot.note(what)
        if not plot.above:
            return f"{marks}: slower than the plot reaches" if marks else ""
        if self.peaks_note.startswith("--device"):
            return f"{marks}: the server beats this device's roofs: is --device right?"
        return f"{marks}: the server beats these roofs (where from: the last line)"

    def render(self) -> Text:
        frame: AttachFrame | None = self.frame
        if frame is None:
            return self.placeholder("no scrape yet")
        width, height = max(10, self.content_size.width), max(4, self.content_size.height)
        steps = self.step_points(frame)
        what = "step" if steps else "interval"
        points = [PlotPoint(p.intensity, p.flops_per_s) for p in steps] or \
            [PlotPoint(h.point.intensity, h.point.flops_per_s) for h in frame.history if h.point is not None][-TRAIL:]
        out = Runs()
        if self.peaks is None and not points:
            for line in wrap_lines(self.peaks_note, width, 2):
                out.add(line, self.style("muted"))
                out.newline()
            out.add(clip(self.verdict(frame), width), self.style("foreground", bold=True))
            return out.text()
        # the marks do not depend on the plot's size: count them first, then give the text its lines
        note = self.marks_note(roofline_plot(self.peaks, points, 10, MIN_PLOT_ROWS + 1, depth=DEPTH), what)
        room = max(1, height - MIN_PLOT_ROWS - 2)  # lines for the verdict and the marks' note
        verdict = wrap_lines(self.verdict(frame), width, max(1, room - bool(note)))
        notes = wrap_lines(note, width, min(2, room - len(verdict)))
        for line in roofline_plot(self.peaks, points, width, height - 1 - len(verdict) - len(notes), depth=DEPTH).rows:
            self.add_cells(out, line)
            out.newline()
        for line in notes:
            out.add(line, self.style("warning"))
            out.newline()
        for line in verdict:
            out.add(line, self.style("foreground", bold=True))
            out.newline()
        out.add(clip(f"roofs: {self.peaks_note}", width), self.style("muted"))
        return out.text()
