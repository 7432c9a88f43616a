"""The roofs a calibration is fitted against: the device's measured roofs, raised to what its steps did.

The fit bounds every efficiency at 1, so the roofs must be at least what the machine does. A measured
roof read in a busy minute is not (22.7 GB/s cached while cpu-demo's batch-1 decode streamed its 247 MB
of weights at 48 GB/s): the fit then held the memory efficiency at 1 and still timed every decode step
40% slow. So the steps raise a measured roof, as a step raises a run's (core_engine.perf.raised_roofs):
a step's FLOP/s and bytes/s are each at most what the device does. Only a step's own rate raises it,
never a rate the fit infers: a decode sweep cannot tell the weights' streaming time from the constant
terms (both nearly constant across it), and a roof raised to where the fit put an efficiency above 1
read 72 GB/s on a host whose fastest step streamed 48. A datasheet's roofs are kept: a step above them
says its work was counted high, not that the device is faster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from batchtop.core_engine.perf.decode_sweep import StepSample
from batchtop.core_engine.perf.device_peaks import DevicePeaks

RAISED = "; raised by the calibration: "  # what a raised roof's source says after the measurement's


def raisable(peaks: DevicePeaks) -> bool:
    """Measured roofs are raised; a datasheet's are the device's by definition."""
    return peaks.source.startswith("measured:")


def seen_roofs(samples: Sequence[StepSample], peaks: DevicePeaks) -> DevicePeaks:
    """Measured roofs raised to the fastest step's FLOP/s and bytes/s, each where that step beat it."""
    if not raisable(peaks) or not samples:
        return peaks
    flops = max(s.cost.flops / s.seconds for s in samples)
    bytes_per_s = max(s.cost.bytes / s.seconds for s in samples)
    return replace(peaks, peak_flops=max(flops, peaks.peak_flops),
                   peak_bytes_per_s=max(bytes_per_s, peaks.peak_bytes_per_s))


def with_raise_note(measured: DevicePeaks, roofs: DevicePeaks) -> tuple[DevicePeaks, str | None]:
    """`roofs` with a source saying what the calibration raised from `measured`, and the caveat that
    says so (None: nothing raised)."""
    raised = []
    if roofs.peak_flops > measured.peak_flops:
        raised.append(f"compute {measured.peak_flops / 1e9:.3g} -> {roofs.peak_flops / 1e9:.3g} GFLOP/s")
    if roofs.peak_bytes_per_s > measured.peak_bytes_per_s:
        raised.append(f"memory {measured.peak_bytes_per_s / 1e9:.3g} -> {roofs.peak_bytes_per_s / 1e9:.3g} GB/s")
    if not raised:
        return measured, None
    words = ", ".join(raised)
    return replace(roofs, source=measured.source + RAISED + words), (
        f"roofs raised to what these steps did ({words}): the measured roofs read low (measured in a busy "
        f"minute, or below the kernels' own speed); the efficiencies are shares of the raised roofs, kept in "
        f"the file, and a --simulate run of this device times its steps by them")
