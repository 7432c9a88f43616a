"""The Roofline panel: where each step sits against this device's roofs, and the verdict for the newest
step's decode rows: is one more sequence nearly free? Raising max_num_seqs moves the decode point
right along the sloped roof."""

from __future__ import annotations

from rich.text import Text

from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.perf.roofline import bound, kernel_bounds, marginal_sequence_cost
from batchtop.core_engine.simulate.calibration import Calibration
from batchtop.tui.sources.frame import DashboardFrame
from batchtop.tui.widgets.common.panel import Panel, Runs
from batchtop.tui.widgets.common.roofline_plot import PlotPoint, roofline_plot


class RooflinePanel(Panel):
    MODELLED = True  # the achieved FLOP/s come from modelled step times

    def __init__(self, peaks: DevicePeaks | None, *, calibration: Calibration | None = None,
                 id: str | None = "roofline") -> None:
        """calibration: a what-if session's; its "+1 seq" is then the simulated step time of one more row
        (overhead included, at the calibrated roofs), as the run itself would time it."""
        super().__init__(id=id)
        self.peaks = peaks
        self.calibration = calibration

    def content_key(self, frame: DashboardFrame) -> object:
        return (frame.trail[-1:] if frame.trail else None), frame.last_decode

    def update_titles(self, frame: DashboardFrame) -> None:
        self.border_title = "Roofline"
        if self.peaks is not None:
            self.border_subtitle = f"● decode ▲ prefill · ridge {self.peaks.ridge_flop_per_byte:.1f} FLOP/B"

    def verdict(self, frame: DashboardFrame) -> str:
        """The teaching text's claim, for the newest step's decode rows: is one more sequence nearly free?
        A step that also carries a prompt chunk (most of them, while a queue waits) is asked about its
        decode rows as a step of their own ("mixed")."""
        snap, peaks = frame.last_decode, self.peaks
        if snap is None or peaks is None:
            return "no decode step yet"
        cost, rows = snap.decode_cost, snap.num_decode_rows
        if self.calibration is not None:
            extra = self.calibration.marginal_sequence_cost(cost, rows, peaks)
        else:
            extra = marginal_sequence_cost(cost, rows, peaks.peak_flops, peaks.peak_bytes_per_s)
        step = bound(cost.intensity, peaks.ridge_flop_per_byte)
        mixed = " (mixed)" if snap.num_prefill_tokens else ""
        text = f"decode x{rows}{mixed}: {step}, +1 seq +{100 * extra:.0f}%"
        odd = [f"{kernel} {b}" for kernel, b in kernel_bounds(cost, peaks.ridge_flop_per_byte).items() if b != step]
        return text + "".join(f" · {o}" for o in odd)  # last: a narrow panel cuts it first

    def render(self) -> Text:
        frame, peaks = self.frame, self.peaks
        if peaks is None:
            return self.placeholder("device peaks unknown")
        if frame is None:
            return self.placeholder("no step yet")
        width, height = max(10, self.content_size.width), max(4, self.content_size.height)
        points = [PlotPoint(p.intensity, p.flops_per_s, p.decode) for p in frame.trail]
        out = Runs()
        for line in roofline_plot(peaks, points, width, height - 1):  # the last line: the verdict
            self.add_cells(out, line)
            out.newline()
        out.add(self.verdict(frame)[:width], self.style("foreground", bold=True))
        return out.text()
