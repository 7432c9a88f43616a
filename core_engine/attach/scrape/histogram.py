"""Prometheus histograms as cumulative bucket counts: deltas between scrapes, merges across replicas,
and quantiles estimated inside a bucket (linear within it, as Prometheus' histogram_quantile does).

A percentile of a window is computed from the window's bucket deltas; percentiles of replicas are
never averaged: their bucket counts are summed first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Histogram:
    bounds: tuple[float, ...]  # upper bounds, ascending, the last one +Inf
    counts: tuple[float, ...]  # cumulative count at each bound
    sum: float
    count: float

    @classmethod
    def empty_like(cls, other: Histogram) -> Histogram:
        return cls(other.bounds, tuple(0.0 for _ in other.bounds), 0.0, 0.0)

    def minus(self, earlier: Histogram) -> Histogram | None:
        """The observations between two scrapes; None when the buckets differ or a count went down
        (the server restarted: its counters began again)."""
        if earlier.bounds != self.bounds or self.count < earlier.count:
            return None
        counts = tuple(a - b for a, b in zip(self.counts, earlier.counts))
        if any(c < 0 for c in counts) or any(b < a for a, b in zip(counts, counts[1:])):
            return None  # a real delta is cumulative too: anything else spans a restart
        return Histogram(self.bounds, counts, self.sum - earlier.sum, self.count - earlier.count)

    def plus(self, other: Histogram) -> Histogram | None:
        """Both sets of observations; None when the buckets differ (they cannot be merged exactly)."""
        if other.bounds != self.bounds:
            return None
        return Histogram(self.bounds, tuple(a + b for a, b in zip(self.counts, other.counts)),
                         self.sum + other.sum, self.count + other.count)

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0..1), linear inside its bucket; None with no observations. A rank in the
        +Inf bucket answers the highest finite bound (all the histogram can say)."""
        total = self.counts[-1] if self.counts else 0.0
        if total <= 0:
            return None
        rank = q * total
        lower_bound, lower_count = 0.0, 0.0
        for bound, cumulative in zip(self.bounds, self.counts):
            if cumulative >= rank and cumulative > lower_count:
                if math.isinf(bound):
                    return lower_bound
                share = (rank - lower_count) / (cumulative - lower_count)
                return lower_bound + (bound - lower_bound) * share
            lower_bound, lower_count = bound, cumulative
        return lower_bound

    def bucket_of(self, value: float) -> tuple[float, float]:
        """The (lower, upper] bucket a value falls in: the resolution any quantile here has."""
        lower = 0.0
        for bound in self.bounds:
            if value <= bound:
                return lower, bound
            lower = bound
        return lower, math.inf

    def as_dict(self) -> dict:
        return {"le": [b if math.isfinite(b) else "+Inf" for b in self.bounds], "counts": list(self.counts),
                "sum": self.sum, "count": self.count}

    @classmethod
    def from_dict(cls, data: dict) -> Histogram:
        bounds = tuple(math.inf if b == "+Inf" else float(b) for b in data["le"])
        return cls(bounds, tuple(float(c) for c in data["counts"]), float(data["sum"]), float(data["count"]))


def merge_all(histograms: list[Histogram]) -> Histogram | None:
    """The sum of several replicas' histograms; None when there are none or their buckets differ."""
    if not histograms:
        return None
    out: Histogram | None = histograms[0]
    for h in histograms[1:]:
        out = out.plus(h) if out is not None else None
    return out
