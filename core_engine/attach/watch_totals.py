"""What a replica's counters and histograms grew by over the whole watch (the window keeps only the
last --window seconds), each interval added as it comes, none across a restart: the traffic that
--export-workload turns into a workload.

The quiet intervals before the first request and after the last are left out of the traffic's span
(kept in `watched_s`): a watch started 20 s before its load would otherwise export the load's rate
diluted by those 20 s. Quiet intervals between requests stay: they are the traffic's own gaps."""

from __future__ import annotations

from batchtop.core_engine.attach.scrape.histogram import Histogram
from batchtop.core_engine.attach.scrape.sample import ReplicaSample
from batchtop.core_engine.attach.scrape.delta import Delta


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


def _moved(d: Delta) -> bool:
    return any(v > 0 for v in d.totals.values()) or any(v > 0 for v in d.success.values()) or \
        any(h.count > 0 for h in d.histograms.values())


class SessionTotals:
    def __init__(self) -> None:
        self.delta: Delta | None = None  # from the first busy interval to the last
        self.watched_s = 0.0  # every interval, the quiet ones at either end too
        self.first_in_flight: float | None = None  # running + waiting where the traffic's span begins and ends
        self.last_in_flight: float | None = None
        self._quiet: Delta | None = None  # the quiet intervals since the last busy one
        self._before: float | None = None  # in flight at the sample before the newest
        self.not_one_server: str | None = None  # why these totals are not one server's traffic
        self._now: float | None = None

    def add(self, d: Delta | None) -> None:
        if d is None:
            return
        self.watched_s += d.dt
        if not (_moved(d) or self._before or self._now):
            if self.delta is not None:
                self._quiet = d if self._quiet is None else plus(self._quiet, d)
            return
        if self.delta is None:
            self.first_in_flight = self._before
        elif self._quiet is not None:
            self.delta = plus(self.delta, self._quiet)
        self._quiet = None
        self.delta = d if self.delta is None else plus(self.delta, d)
        self.last_in_flight = self._now

    def saw(self, sample: ReplicaSample) -> None:
        self._before = self._now
        if sample.running is None and sample.waiting is None:
            self._now = None
            return
        self._now = (sample.running or 0.0) + (sample.waiting or 0.0)
