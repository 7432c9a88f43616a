"""The log-log roofline plot both Roofline panels draw: the device's memory and compute roofs, the
ridge, and a trail of points (the newest one bold), in theme colour names the panel turns into styles.

x is arithmetic intensity (FLOP per byte moved), y achieved FLOP/s. Left of the ridge a step is
memory-bound: it reads the weights once whatever the batch, so one more sequence is nearly free.

No point is dropped: one above its roof is drawn as ↑ (at the top edge when it is off the axes too), one
under the bottom of the axes as ↓ on the bottom edge, and the plot counts them for the panel to say why
(roofs measured before the kernels came in, or on a busy host; a model whose weights fit in a cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from batchtop.core_engine.perf.device_peaks import DevicePeaks, format_rate

Cell = tuple[str, str]  # glyph, theme colour name ("!" at the end: bold)
ABOVE, BELOW = "↑", "↓"  # a point above its roof (or off the top), one under the axes, drawn on the edge


@dataclass(frozen=True, slots=True)
class PlotPoint:
    intensity: float  # FLOP / byte
    flops_per_s: float
    decode: bool = True  # ● a decode step (or a server's interval), ▲ one that prefills


def _decades(values: list[float], around: float) -> tuple[float, float]:
    lo = min([math.floor(math.log10(around)) - 1, *(math.floor(math.log10(v)) for v in values)])
    hi = max([math.ceil(math.log10(around)) + 1, *(math.ceil(math.log10(v)) for v in values)])
    return 10.0 ** lo, 10.0 ** hi


@dataclass(frozen=True, slots=True)
class Plot:
    rows: list[list[Cell]]  # the plot's rows, then the x axis's decades
    above: int = 0  # points above their roof (ABOVE), those off the top of the axes included
    most_above: float = 0.0  # the highest of their fractions of the roof
    below: int = 0  # points under the bottom of the axes, drawn on it (BELOW)

    def note(self, what: str = "step") -> str:
        """The marks' legend, "" with none: "↑ 3 steps above the roof (up to 1.9x) ↓ 1 under the axis"."""
        parts = []
        if self.above:
            most = (f"{self.most_above:.2g}x" if self.most_above < 10 else f"{self.most_above:.0f}x"
                    if self.most_above < 1000 else ">1000x")
            parts.append(f"{ABOVE} {self.above} {what}{'s' if self.above != 1 else ''} above the roof (up to {most})")
        if self.below:
            parts.append(f"{BELOW} {self.below} under the axis")
        return " ".join(parts)


def roofline_plot(peaks: DevicePeaks | None, points: list[PlotPoint], width: int, height: int, *,
                  depth: float = 1.5) -> Plot:
    """`height` rows of `width` cells: the plot, then the x axis's decades; the y axis reaches `depth`
    times under the memory roof at the left edge (an engine's steps sit near their roofs; a watched
    server's may sit a decade under them). Without roofs, the axes fit the points alone (and no point can
    be off them). The roofs' label tops the plot where it fits whole; the Device panel gives them in full."""
    plot_h = height - 1
    xs = [p.intensity for p in points if p.intensity > 0]
    ys = [p.flops_per_s for p in points if p.flops_per_s > 0]
    ridge = peaks.ridge_flop_per_byte if peaks is not None else (xs[0] if xs else 1.0)
    x_lo, x_hi = _decades(xs, ridge)
    if peaks is not None:
        y_hi, y_lo = peaks.peak_flops * 1.5, peaks.peak_bytes_per_s * x_lo / depth
    else:
        y_hi = max([*(y * 10 for y in ys), 1.0])
        y_lo = min([*(y / 10 for y in ys), y_hi / 10])
    lx0, lxs = math.log10(x_lo), math.log10(x_hi) - math.log10(x_lo)
    ly0, lys = math.log10(y_lo), max(1e-9, math.log10(y_hi) - math.log10(y_lo))

    def col(x: float) -> int:
        return round((math.log10(max(x, x_lo)) - lx0) / lxs * (width - 1))

    def row(y: float) -> int:
        return plot_h - 1 - round((math.log10(max(y, y_lo)) - ly0) / lys * (plot_h - 1))

    grid: list[list[Cell]] = [[(" ", "muted")] * width for _ in range(plot_h)]
    if peaks is not None:
        for c in range(width):
            x = 10 ** (lx0 + c / (width - 1) * lxs)
            r = row(peaks.roof(x))
            if 0 <= r < plot_h:
                grid[r][c] = ("─" if x >= ridge else "·", "roof")
        rc = col(ridge)
        for r in range(row(peaks.peak_flops) + 1, plot_h):
            if grid[r][rc][0] == " ":
                grid[r][rc] = ("┊", "roof")
    above, most_above, below = 0, 0.0, 0
    marks: dict[tuple[int, int], Cell] = {}  # (row, column): the newest point there
    for i, p in enumerate(points):
        last = i == len(points) - 1
        glyph = ("●" if p.decode else "▲") if last else "•"
        fraction = p.flops_per_s / peaks.roof(p.intensity) if peaks is not None and p.intensity > 0 else 0.0
        if fraction > 1:
            above, most_above, glyph = above + 1, max(most_above, fraction), ABOVE
        elif p.flops_per_s < y_lo:
            below, glyph = below + 1, BELOW
        at = (min(max(row(p.flops_per_s), 0), plot_h - 1), min(max(col(p.intensity), 0), width - 1))
        marks[at] = (glyph, ("point-decode" if p.decode else "point-prefill") + ("!" if last else ""))
    if peaks is not None:  # the roofs' label, where it fits whole on the top row clear of roof and points
        label = peaks.roofs_text(" · ")
        if (len(label) < width and all(glyph == " " for glyph, _ in grid[0][:len(label) + 1])
                and not any(r == 0 and c <= len(label) for r, c in marks)):
            grid[0][:len(label)] = [(ch, "muted") for ch in label]
    for (r, c), cell in marks.items():
        grid[r][c] = cell
    axis = format_rate(x_lo, "FLOP/B").ljust(width // 2) + format_rate(x_hi, "FLOP/B").rjust(width - width // 2)
    grid.append([(ch, "muted") for ch in axis[:width]])
    return Plot(grid, above, most_above, below)
