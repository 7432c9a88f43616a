"""What a replica's counters and histograms grew by over the whole watch (the window keeps only the
last --window seconds), each interval added as it comes, none across a restart: the traffic that
--export-workload turns into a workload."""

from __future__ import annotations

from batchtop.core_engine.attach.histogram import Histogram
from batchtop.core_engine.attach.sample import ReplicaSample
from batchtop.core_engine.attach.delta import Delta


def _add(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in a.keys() | b.keys()}


def _merge(a: dict[str, Histogram], b: dict[str, Histogram]) -> dict[str, Histogram]:
    """Bucket by bucket; a histogram whose buckets changed (a restart with other settings) starts again."""
    out = dict(a)
    for k, h in b.items():
        merged = out[k].plus(h) if k in out else h
        out[k] = merged if merged is not None else h
    return out


def plus(a: Delta, b: Delta) -> Delta:
    dt = a.dt + b.dt
    totals = _add(a.totals, b.totals)
    return Delta(dt, totals, {k: v / dt for k, v in totals.items()} if dt > 0 else {},
                 _merge(a.histograms, b.histograms), _add(a.success, b.success))


class SessionTotals:
    def __init__(self) -> None:
        self.delta: Delta | None = None
        self.first_in_flight: float | None = None  # running + waiting at the first and the newest sample
        self.last_in_flight: float | None = None

    def add(self, d: Delta | None) -> None:
        if d is not None:
            self.delta = d if self.delta is None else plus(self.delta, d)

    def saw(self, sample: ReplicaSample) -> None:
        if sample.running is None and sample.waiting is None:
            return
        in_flight = (sample.running or 0.0) + (sample.waiting or 0.0)
        if self.first_in_flight is None:
            self.first_in_flight = in_flight
        self.last_in_flight = in_flight
