"""A replica's recent samples: the last interval gives its rates, the sliding window its percentiles.

A counter that went backwards means the server restarted: the window starts again from the new
sample, so no rate is ever computed across the restart (and none is ever negative).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from batchtop.core_engine.attach.histogram import Histogram
from batchtop.core_engine.attach.sample import ReplicaSample
from batchtop.core_engine.attach.scrape import DOWN, LIVE, ScrapeResult


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
    if any(after.counters.get(k, v) < v for k, v in before.counters.items()):
        return True
    if any(after.success.get(k, v) < v for k, v in before.success.items()):
        return True
    return any(k in after.histograms and after.histograms[k].count < h.count for k, h in before.histograms.items())


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


class ReplicaWindow:
    """Samples of one replica within the last window_s seconds, and its health."""

    def __init__(self, url: str, window_s: float) -> None:
        self.url = url
        self.window_s = window_s
        self.samples: deque[ReplicaSample] = deque()
        self.status = DOWN
        self.reason: str | None = "not scraped yet"
        self.resets = 0  # times its counters went backwards
        self.last_latency_s: float | None = None
        self.status_counts: dict[str, int] = {}  # scrapes by status, for the JSON's health

    def add(self, result: ScrapeResult) -> None:
        self.status, self.reason, self.last_latency_s = result.status, result.reason, result.latency_s
        self.status_counts[result.status] = self.status_counts.get(result.status, 0) + 1
        sample = result.sample
        if result.status != LIVE or sample is None:
            return  # the last good numbers stay on screen, marked with the status
        if self.samples and went_backwards(self.samples[-1], sample):
            self.samples.clear()
            self.resets += 1
        self.samples.append(sample)
        while len(self.samples) > 2 and self.samples[1].t <= sample.t - self.window_s:
            self.samples.popleft()

    @property
    def latest(self) -> ReplicaSample | None:
        return self.samples[-1] if self.samples else None

    def interval(self) -> Delta | None:
        """The newest interval (previous sample -> newest), None until there are two since a reset.
        While the replica is not LIVE it has no current interval: its rates are unknown, not zero."""
        if self.status != LIVE or len(self.samples) < 2:
            return None
        return delta(self.samples[-2], self.samples[-1])

    def window(self) -> Delta | None:
        if len(self.samples) < 2:
            return None
        return delta(self.samples[0], self.samples[-1])
