"""A replica's recent samples: the last interval gives its rates, the sliding window its percentiles.

A restart (a new process start time, or a counter that went backwards where the server does not say
its start time) starts the window again from the new sample, so no rate is ever computed across it
(and none is ever negative). A sample no real server can give (plausible.py), or a counter that went
backwards in the same process, is not taken in: the replica is BAD for that scrape, with the reason.
"""

from __future__ import annotations

import math
from collections import deque

from batchtop.core_engine.attach.scrape.delta import Delta, delta
from batchtop.core_engine.attach.scrape.plausible import first_backwards, restarted, sample_problem, same_process
from batchtop.core_engine.attach.scrape.sample import ReplicaSample
from batchtop.core_engine.attach.scrape.scrape import BAD, DOWN, LIVE, ScrapeResult
from batchtop.core_engine.attach.watch_totals import SessionTotals

FLAP_RESETS, FLAP_SCRAPES = 3, 10  # this many restarts within this many scrapes: not one server


def _too_fast(d: Delta | None) -> str | None:
    """A counter growing faster than a float holds per second: no server counts that, no panel draws it."""
    for key, rate in (d.per_s.items() if d is not None else ()):
        if not math.isfinite(rate):
            return f"{key} grew by {d.totals[key]:.3g} in {d.dt:.3g} s: faster than any server"
    return None


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
        self.session = SessionTotals()
        self._taken = 0
        self._reset_at: deque[int] = deque(maxlen=FLAP_RESETS)  # which takes restarted the counters

    def add(self, result: ScrapeResult) -> None:
        status, reason, sample = result.status, result.reason, result.sample
        if status == LIVE and sample is not None:
            reason = self._take(sample)
            status = LIVE if reason is None else BAD
        self.status, self.reason, self.last_latency_s = status, reason, result.latency_s
        self.status_counts[status] = self.status_counts.get(status, 0) + 1

    def _take(self, sample: ReplicaSample) -> str | None:
        """Add a live sample; why the replica is BAD for it, or None. An impossible sample is not added:
        the last good numbers stay on screen."""
        problem = sample_problem(sample)
        if problem is not None:
            return problem
        refused = None
        if self.samples:
            before = self.samples[-1]
            backwards = first_backwards(before, sample)
            if backwards is not None and same_process(before, sample):
                # no restart explains it: BAD for this scrape; the window starts again from it all the
                # same, so no rate spans the drop and one drop does not hold the replica BAD for good
                refused = f"{backwards} with no restart (same process_start_time_seconds)"
                self.samples.clear()
            elif backwards is not None or restarted(before, sample):
                self.samples.clear()
                self.resets += 1
                self._reset_at.append(self._taken)
            elif (too_fast := _too_fast(delta(before, sample))) is not None:
                return too_fast
        self._taken += 1
        if len(self._reset_at) == FLAP_RESETS and self._taken - self._reset_at[0] <= FLAP_SCRAPES:
            # counters that fall back every few scrapes are two servers taking turns behind one URL (a
            # load balancer): each step up between them is a rate no server had. No interval is taken
            # in; the newest sample stays so the next drop is still seen.
            self.samples.clear()
            self.samples.append(sample)
            reason = (f"counters restarted {FLAP_RESETS} times in {self._taken - self._reset_at[0]} scrapes: more "
                      "than one server answers this URL (a load balancer?), or it restarts every few seconds; "
                      "attach each server's own URL")
            self.session.not_one_server = self.session.not_one_server or reason
            return reason
        self.samples.append(sample)
        self.session.saw(sample)
        if len(self.samples) >= 2:
            self.session.add(delta(self.samples[-2], sample))
        while len(self.samples) > 2 and self.samples[1].t <= sample.t - self.window_s:
            self.samples.popleft()
        return refused

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
