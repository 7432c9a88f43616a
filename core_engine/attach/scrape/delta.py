"""What happened between two samples of a replica: counter growth, rates, histogram observations."""

from __future__ import annotations

from dataclasses import dataclass, field

from batchtop.core_engine.attach.scrape.histogram import Histogram
from batchtop.core_engine.attach.scrape.plausible import first_backwards
from batchtop.core_engine.attach.scrape.sample import ReplicaSample


@dataclass(frozen=True, slots=True)
class Delta:
    """What happened between two samples (or summed over replicas): counter growth, per-second rates,
    histogram observations and finished requests."""

    dt: float
    totals: dict[str, float] = field(default_factory=dict)
    per_s: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    success: dict[str, float] = field(default_factory=dict)


def went_backwards(before: ReplicaSample, after: ReplicaSample) -> bool:
    return first_backwards(before, after) is not None


def delta(before: ReplicaSample, after: ReplicaSample) -> Delta | None:
    dt = after.t - before.t
    if dt <= 0 or went_backwards(before, after):
        return None
    totals = {k: v - before.counters[k] for k, v in after.counters.items() if k in before.counters}
    hists = {}
    for k, h in after.histograms.items():
        if k in before.histograms and (d := h.minus(before.histograms[k])) is not None:
            hists[k] = d
    success = {k: v - before.success.get(k, 0.0) for k, v in after.success.items()}
    return Delta(dt, totals, {k: v / dt for k, v in totals.items()}, hists, success)
