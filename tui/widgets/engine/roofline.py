"""The Roofline panel: where each step sits, log-log, against this device's memory and compute roofs.

x is arithmetic intensity (FLOP per byte moved), y achieved FLOP/s. Left of the ridge a step is
memory-bound: it reads the weights once whatever the batch, so one more sequence is nearly free and
raising max_num_seqs moves the decode point right along the sloped roof.
"""

from __future__ import annotations

import math

from rich.text import Text

from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.perf.roofline import bound, kernel_bounds, marginal_sequence_cost
from batchtop.core_engine.simulate.calibration import Calibration
from batchtop.tui.sources.frame import DashboardFrame
from batchtop.tui.widgets.common.panel import Panel, Runs


def si(value: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


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
        plot_h = height - 2  # last two lines: x labels and the verdict
        ridge = peaks.ridge_flop_per_byte
        seen = [p.intensity for p in frame.trail if p.intensity > 0]
        x_lo = 10 ** min([math.floor(math.log10(ridge)) - 1, *(math.floor(math.log10(x)) for x in seen)])
        x_hi = 10 ** max([math.ceil(math.log10(ridge)) + 1, *(math.ceil(math.log10(x)) for x in seen)])
        y_hi = peaks.peak_flops * 1.5
        y_lo = peaks.peak_bytes_per_s * x_lo / 1.5
        lx0, lxs = math.log10(x_lo), math.log10(x_hi) - math.log10(x_lo)
        ly0, lys = math.log10(y_lo), math.log10(y_hi) - math.log10(y_lo)

        def col(x: float) -> int:
            return round((math.log10(max(x, x_lo)) - lx0) / lxs * (width - 1))

        def row(y: float) -> int:
            return plot_h - 1 - round((math.log10(max(y, y_lo)) - ly0) / lys * (plot_h - 1))

        grid: list[list[tuple[str, str]]] = [[(" ", "muted")] * width for _ in range(plot_h)]
        for c in range(width):
            x = 10 ** (lx0 + c / (width - 1) * lxs)
            r = row(peaks.roof(x))
            if 0 <= r < plot_h:
                grid[r][c] = ("─" if x >= ridge else "·", "roof")
        rc = col(ridge)
        for r in range(row(peaks.peak_flops) + 1, plot_h):
            if grid[r][rc][0] == " ":
                grid[r][rc] = ("┊", "roof")
        label = f"{si(peaks.peak_flops, 'FLOP/s')} · {si(peaks.peak_bytes_per_s, 'B/s')}"
        if all(glyph == " " for glyph, _ in grid[0][:len(label) + 1]):
            grid[0][:len(label)] = [(ch, "muted") for ch in label]
        trail = frame.trail
        for i, p in enumerate(trail):
            r, c = row(p.flops_per_s), col(p.intensity)
            if 0 <= r < plot_h and 0 <= c < width:
                last = i == len(trail) - 1
                glyph = ("●" if p.decode else "▲") if last else "•"
                grid[r][c] = (glyph, ("point-decode" if p.decode else "point-prefill") + ("!" if last else ""))
        out = Runs()
        for line in grid:
            for glyph, colour in line:
                bold = colour.endswith("!")
                out.add(glyph, self.style(colour.rstrip("!"), bold=bold, dim=not bold and colour.startswith("point")))
            out.newline()
        axis = f"{si(x_lo, 'FLOP/B')}".ljust(width // 2) + f"{si(x_hi, 'FLOP/B')}".rjust(width - width // 2)
        out.add(axis[:width], self.style("muted"))
        out.newline()
        out.add(self.verdict(frame)[:width], self.style("foreground", bold=True))
        return out.text()
