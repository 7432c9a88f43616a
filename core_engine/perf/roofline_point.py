"""One point on the roofline: work done over the time it took, placed against a device's roofs.

The engine's Roofline panel plots one per step (the step's analytic FLOPs and bytes over its forward's
own time); attach plots one per scrape interval of a live server (its counters, or an estimate from
its token rates).
"""

from __future__ import annotations

from dataclasses import dataclass

from batchtop.core_engine.perf import roofline
from batchtop.core_engine.perf.device_peaks import DevicePeaks

BELIEVABLE = (1e-30, 1e30)  # FLOP/byte and FLOP/s of any real machine lie far inside; the chart's logs need finite


@dataclass(frozen=True, slots=True)
class RooflinePoint:
    intensity: float  # FLOP per byte
    flops_per_s: float
    # "step" (an engine step), "measured" (a server's own counters) or "estimated" (its token rates x the
    # FLOP/byte model)
    source: str
    decode: bool | None = None  # a step without prefill tokens; None for a server's interval, which mixes both
    batch: int | None = None  # rows in the step's forward; None for a server's interval

    def fraction_of_roof(self, peaks: DevicePeaks) -> float:
        return self.flops_per_s / peaks.roof(self.intensity)

    def bound(self, peaks: DevicePeaks) -> str:
        return roofline.bound(self.intensity, peaks.ridge_flop_per_byte)

    def as_dict(self, peaks: DevicePeaks | None) -> dict:
        out: dict = {"intensity_flop_per_byte": self.intensity, "flops_per_s": self.flops_per_s, "source": self.source}
        if self.decode is not None:
            out["decode"] = self.decode
        if self.batch is not None:
            out["batch"] = self.batch
        if peaks is not None:
            out.update(bound=self.bound(peaks), fraction_of_roof=self.fraction_of_roof(peaks))
        return out


def believable(point: RooflinePoint) -> bool:
    lo, hi = BELIEVABLE
    return lo <= point.intensity <= hi and lo <= point.flops_per_s <= hi
