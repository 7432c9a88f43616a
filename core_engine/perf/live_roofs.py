"""The roofs a live run is placed against, measured again when what they measured no longer runs.

A CPU's roofs are measured, and a dashboard's first session measures them before batchtop's C++
kernels exist: its first steps run torch's ops while the kernels build in the background, and an AVX2
CPU's emulated bf16 GEMM reads 306 MFLOP/s where the kernels reach 99 GFLOP/s. So:

- when the kernels come in (the step whose controls say so: worker/kernel_switch.py), the roofs are
  measured again with them (device_peaks caches them under the kernels' build, apart from torch's);
- when a step runs above ABOVE_ROOF of its roof (a roof measured on a busy host, or a stale cache),
  they are measured once more, each roof kept at the better of the two measurements, and the note says
  whether the step still beats them (a model whose weights fit in the last-level cache can);
- any step above a roof, by any margin, raises it to what the step did (raised_roofs.py), in the run
  and in the cache, so the panels never show a step above its roofs; the Device panel says which step.

The measurement runs on the engine thread between two steps, after the step's snapshot: on a CPU it
needs the cores the steps use (measured beside a running step, both read low), so the engine waits the
second or two it takes, and the note says so meanwhile. Only measured roofs are kept this way: a
datasheet's, a recording's or a test's are left as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from batchtop.core_engine.perf.device_peaks import DevicePeaks, best_of, device_peaks, last_level_cache_bytes
from batchtop.core_engine.perf.raised_roofs import RoofRaiser
from batchtop.core_engine.worker.kernel_switch import kernels_came_in

ABOVE_ROOF = 1.2  # a step this far above its roof is no measurement noise: the roofs are measured again


@dataclass(frozen=True, slots=True)
class RoofsView:
    """What the panels show: the roofs now, and what last happened to them."""

    peaks: DevicePeaks
    note: str | None = None  # what happened, said once (a toast); None for a raise, which lines say
    measuring: bool = False
    lines: tuple[str, ...] = ()  # each roof's origin and the ISA peak (RoofRaiser.lines)


def fraction_of_roof(snap: object, peaks: DevicePeaks) -> float:
    """A step's achieved FLOP/s over its roof at its intensity; 0 for a step with no device work."""
    cost = snap.cost
    if not snap.is_step or snap.forward_s <= 0 or cost.bytes <= 0:
        return 0.0
    roof = peaks.roof(cost.intensity)
    return cost.flops / snap.forward_s / roof if roof > 0 else 0.0


class LiveRoofs:
    def __init__(self, peaks: DevicePeaks, device: str, dtype: str, *,
                 measure: Callable[[bool], DevicePeaks] | None = None,
                 on_change: Callable[[RoofsView], None] = lambda view: None) -> None:
        """measure(refresh): the roofs now (refresh: measured again even when cached); device_peaks
        unless given. on_change: called on the engine thread before and after each measurement."""
        self.device, self.dtype = device, dtype
        self._kept = measure is None  # raises go to the cache only of roofs device_peaks gave
        self.raiser = self._raiser(peaks)
        self.view = RoofsView(peaks, lines=tuple(self.raiser.lines()))
        self.on_change = on_change
        self._measure = measure or (lambda refresh: device_peaks(device, dtype, refresh=refresh))
        self._rechecked = False  # a step beat these roofs and they were measured again

    def _raiser(self, peaks: DevicePeaks) -> RoofRaiser:
        return RoofRaiser.for_run(peaks, self.device, self.dtype) if self._kept else RoofRaiser(peaks)

    @staticmethod
    def applies(peaks: DevicePeaks | None) -> bool:
        """Whether these roofs were measured (a datasheet's are not measured again)."""
        return peaks is not None and peaks.source.startswith("measured:")

    @property
    def peaks(self) -> DevicePeaks:
        return self.view.peaks

    def observe(self, snap: object) -> None:
        """After each step, on the engine thread: measure again if the kernels came in or a step beat the roofs."""
        if kernels_came_in(getattr(snap, "controls", ())):
            self._rechecked = False  # new roofs: a step may beat them once more
            self._set(RoofsView(self.peaks, "the C++ kernels came in: re-measuring the roofs on them…", True,
                                self.view.lines))
            peaks = self._measured(False)
            if peaks is None:
                return
            how = "cached roofs of" if peaks.source.endswith("(cached)") else "roofs re-measured with"
            self._reset(peaks, f"{how} the C++ kernels: {peaks.roofs_text()}")
            self._raise(snap)
            return
        above = fraction_of_roof(snap, self.peaks)
        if self._rechecked or above <= ABOVE_ROOF:
            self._raise(snap)
            return
        self._rechecked = True
        self._set(RoofsView(self.peaks, f"a step ran at {above:.1f}x the roof: re-measuring the roofs…", True,
                            self.view.lines))
        fresh = self._measured(True)
        if fresh is None:
            self._raise(snap)
            return
        if fresh.with_batchtop_kernels == self.peaks.with_batchtop_kernels:
            fresh = best_of(self.peaks, fresh)
        note = f"a step ran at {above:.1f}x the roof; re-measured: {fresh.roofs_text()}"
        self.raiser = self._raiser(fresh)
        if self.raiser.observe(snap) is not None:
            note += (f"; the step is still above them{_cache_reason(snap.cost.weight_bytes)}: "
                     f"raised to {self.raiser.peaks.roofs_text()}")
        self._reset(self.raiser.peaks, note, keep_raiser=True)

    def _raise(self, snap: object) -> None:
        """Any step above a roof raises it: said on the Device panel, not in a note of its own."""
        if self.raiser.observe(snap) is not None:
            self._set(RoofsView(self.raiser.peaks, None, False, tuple(self.raiser.lines())))

    def _reset(self, peaks: DevicePeaks, note: str, keep_raiser: bool = False) -> None:
        """New roofs from a measurement: a raiser of their own, raised from them on."""
        if not keep_raiser:
            self.raiser = self._raiser(peaks)
        self._set(RoofsView(peaks, note, False, tuple(self.raiser.lines())))

    def _measured(self, refresh: bool) -> DevicePeaks | None:
        """The roofs measured now; None, the old roofs kept and the note saying why, where that fails
        (a measurement must never stop the run it measures for)."""
        try:
            return self._measure(refresh)
        except Exception as exc:  # noqa: BLE001 - whatever the probes raise, the engine runs on
            self._set(RoofsView(self.peaks, f"could not measure the roofs again: {type(exc).__name__}: {exc}",
                                lines=self.view.lines))
            return None

    def _set(self, view: RoofsView) -> None:
        self.view = view
        self.on_change(view)


def _cache_reason(weight_bytes: float) -> str:
    """Why a step can beat a memory roof measured on a stream no cache holds: its weights fit in one."""
    llc = last_level_cache_bytes()
    if llc is not None and 0 < weight_bytes <= llc:
        return f" (its {weight_bytes / 2**20:.0f} MiB of weights fit in the {llc >> 20} MiB cache)"
    return ""
