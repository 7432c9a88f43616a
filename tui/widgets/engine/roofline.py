"""The Roofline panel: where each step sits against this device's roofs, and the verdict for the newest
step's decode rows: is one more sequence nearly free? Raising max_num_seqs moves the decode point
right along the sloped roof.

The roofs are the frame's where the live source keeps them (re-measured when the CPU kernels come in,
or when a step beats them: core_engine/perf/live_roofs.py), else the ones the panel was given. A step
above its roof is drawn as ↑, and a line under the plot says how many and why; the verdict wraps, and
only where the panel is too short for it does its end give way to "…"."""

from __future__ import annotations

from rich.text import Text

from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.perf.live_roofs import ABOVE_ROOF
from batchtop.core_engine.perf.roofline import bound, device_regime, kernel_bounds, marginal_sequence_cost
from batchtop.core_engine.simulate.calibration import Calibration
from batchtop.core_engine.run.frame import DashboardFrame
from batchtop.tui.widgets.common.text_fit import first_fit
from batchtop.tui.widgets.common.panel import Panel, Runs
from batchtop.tui.widgets.common.roofline_plot import ABOVE, Plot, PlotPoint, roofline_plot
from batchtop.tui.widgets.common.wrap import wrap_lines

MIN_PLOT_ROWS = 4  # the plot keeps this many rows (and its axis) however long the text under it


class RooflinePanel(Panel):
    MODELLED = True  # the achieved FLOP/s come from modelled step times

    def __init__(self, peaks: DevicePeaks | None, *, calibration: Calibration | None = None, num_layers: int = 0,
                 id: str | None = "roofline") -> None:
        """calibration: a what-if session's; its "+1 seq" is then the simulated step time of one more row
        (overhead and the `num_layers` decoder layers' latency included, at the calibrated roofs), as the run
        itself would time it."""
        super().__init__(id=id)
        self.peaks = peaks
        self.calibration = calibration
        self.num_layers = num_layers

    def roofs(self, frame: DashboardFrame | None) -> DevicePeaks | None:
        """The roofs to draw: the live source's newest, else the ones given."""
        live = getattr(frame, "roofs", None)
        return live.peaks if live is not None else self.peaks

    def content_key(self, frame: DashboardFrame) -> object:
        return (frame.trail[-1:] if frame.trail else None), frame.last_decode, getattr(frame, "roofs", None)

    def update_titles(self, frame: DashboardFrame) -> None:
        self.border_title = "Roofline"
        peaks = self.roofs(frame)
        if peaks is not None:
            # the count of ↑ marks leads: the line saying why may not fit a short panel
            above = self.marks(frame).above
            marks = f"{ABOVE}{above} above · " if above else ""
            ridge = f"ridge {peaks.ridge_flop_per_byte:.1f} FLOP/B"
            self.border_subtitle = first_fit([f"{marks}● decode ▲ prefill · {ridge}", f"{marks}{ridge}",
                                              f"{marks}ridge {peaks.ridge_flop_per_byte:.1f}"], self.title_room())

    def points(self, frame: DashboardFrame) -> list[PlotPoint]:
        return [PlotPoint(p.intensity, p.flops_per_s, p.decode) for p in frame.trail]

    def marks(self, frame: DashboardFrame) -> Plot:
        """The trail's points above the roof or off the axes (which do not depend on the plot's size)."""
        return roofline_plot(self.roofs(frame), self.points(frame), 10, MIN_PLOT_ROWS + 1)

    def verdict(self, frame: DashboardFrame) -> str:
        """The teaching text's claim, for the newest step's decode rows: is one more sequence nearly free?
        A step that also carries a prompt chunk (most of them, while a queue waits) is asked about its
        decode rows as a step of their own ("mixed")."""
        snap, peaks = frame.last_decode, self.roofs(frame)
        if snap is None or peaks is None:
            return "no decode step yet"
        cost, rows = snap.decode_cost, snap.num_decode_rows
        if self.calibration is not None:
            extra = self.calibration.marginal_sequence_cost(cost, rows, peaks, self.num_layers)
        else:
            extra = marginal_sequence_cost(cost, rows, peaks.peak_flops, peaks.peak_bytes_per_s)
        step = bound(cost.intensity, peaks.ridge_flop_per_byte)
        mixed = " (mixed)" if snap.num_prefill_tokens else ""
        here = (device_regime(step, peaks.ridge_flop_per_byte) or ("", ""))[0]  # this device's ridge decides
        text = f"decode x{rows}{mixed}: {step}{here}, +1 seq +{100 * extra:.0f}%"
        odd = [f"{kernel} {b}" for kernel, b in kernel_bounds(cost, peaks.ridge_flop_per_byte).items() if b != step]
        return text + "".join(f" · {o}" for o in odd)  # last: a short panel shows it on a line of its own

    def device_note(self, frame: DashboardFrame) -> str | None:
        """Where this device's ridge makes the newest decode step compute-bound (the verdict says so),
        what a GPU would show (core_engine.perf.roofline.device_regime)."""
        snap, peaks = frame.last_decode, self.roofs(frame)
        if snap is None or peaks is None:
            return None
        regime = device_regime(bound(snap.decode_cost.intensity, peaks.ridge_flop_per_byte), peaks.ridge_flop_per_byte)
        return regime[1] if regime else None

    def marks_note(self, frame: DashboardFrame) -> str:
        """What the plot's marks are and why: what happened to the live roofs, "" with no marks. While
        they are measured again, that is what shows, marks or not."""
        plot, live = self.marks(frame), getattr(frame, "roofs", None)
        marks = plot.note()
        if live is not None and live.note and (plot.above or live.measuring):
            return f"{marks}: {live.note}" if marks else live.note
        if not marks:
            return ""
        if not plot.above:
            return f"{marks}: far below the roofs"
        if live is not None and plot.most_above <= ABOVE_ROOF:  # the live roofs are measured again above it
            return f"{marks}: within {ABOVE_ROOF:g}x of the roof, noise: not re-measured"
        return f"{marks}: these roofs sit below what the steps reach"

    def render(self) -> Text:
        frame, peaks = self.frame, self.roofs(self.frame)
        if peaks is None:
            return self.placeholder("device peaks unknown")
        if frame is None:
            return self.placeholder("no step yet")
        width, height = max(10, self.content_size.width), max(4, self.content_size.height)
        note = self.marks_note(frame)
        room = max(1, height - MIN_PLOT_ROWS - 1)  # lines under the plot and its axis
        verdict = wrap_lines(self.verdict(frame), width, max(1, room - bool(note)))
        notes = wrap_lines(note, width, min(2, room - len(verdict)))
        device = wrap_lines(self.device_note(frame) or "", width, room - len(verdict) - len(notes))
        lines = ([(t, self.style("warning")) for t in notes]
                 + [(t, self.style("foreground", bold=True)) for t in verdict]
                 + [(t, self.style("muted")) for t in device])
        out = Runs()
        for line in roofline_plot(peaks, self.points(frame), width, height - len(lines)).rows:
            self.add_cells(out, line)
            out.newline()
        for i, (text, style) in enumerate(lines):
            out.add(text, style)
            if i < len(lines) - 1:
                out.newline()
        return out.text()
