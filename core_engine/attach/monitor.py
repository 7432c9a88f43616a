"""The attach loop's state: a window per replica, fed by live scrapes (watch.py) or by a recording, and
the frame every consumer reads (the dashboard, the headless JSON, the replay): per-replica stats, the
aggregate, the imbalance, the verdict on what bounds the batch, a short history of the signals behind
it (which the strip charts draw too), and what the panels show worked out from them (readings.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from batchtop.core_engine.attach.aggregate import Imbalance, aggregate, imbalances, merge_deltas
from batchtop.core_engine.attach.history import HistoryPoint, history_point
from batchtop.core_engine.attach.readings import MainReadings, main_readings, with_readings
from batchtop.core_engine.attach.verdict.left_out import LeftOut
from batchtop.core_engine.attach.server_point import ModelEstimate
from batchtop.core_engine.attach.scrape.scrape import ScrapeResult
from batchtop.core_engine.attach.stats import ReplicaStats, build_stats
from batchtop.core_engine.attach.window import ReplicaWindow
from batchtop.core_engine.attach.verdict.verdict import Verdict
from batchtop.core_engine.attach.verdict.verdict_tracker import VerdictTracker

HISTORY = 240  # intervals the strip charts, the roofline trail and the verdict remember
__all__ = ["AttachFrame", "HistoryPoint", "Monitor"]


@dataclass(frozen=True, slots=True)
class AttachFrame:
    t: float  # seconds since the monitor started
    tick: int
    replicas: tuple[ReplicaStats, ...]
    aggregate: ReplicaStats
    imbalances: tuple[Imbalance, ...]
    history: tuple[HistoryPoint, ...]
    readings: MainReadings
    verdict: Verdict | None = None

    @property
    def main(self) -> ReplicaStats:
        """What the single-server panels show: the one replica, or the aggregate of several."""
        return self.replicas[0] if len(self.replicas) == 1 else self.aggregate


class Monitor:
    """Windows and stats for a list of replicas; feed() takes one scrape result per replica per tick."""

    def __init__(self, urls: list[str], *, window_s: float = 30.0, max_num_seqs: int | None = None,
                 estimate: ModelEstimate | None = None) -> None:
        self.urls = list(urls)
        self.windows = [ReplicaWindow(u, window_s) for u in self.urls]
        self.max_num_seqs = max_num_seqs
        self.estimate = estimate
        self.tick = 0
        self.t = 0.0
        self._history: deque[HistoryPoint] = deque(maxlen=HISTORY)
        self.tracker = VerdictTracker()
        self.left_out = LeftOut()  # implausible scrapes: out of the verdict, which says so
        self.verdict: Verdict | None = None

    def feed(self, results: list[ScrapeResult], t: float) -> AttachFrame:
        self.tick += 1
        for window, result in zip(self.windows, results):
            window.add(result)
            self.left_out.saw(self.tick, t, window.url, window.status, window.reason)
        self.t = t
        stats, agg, found = self._stats()
        main = stats[0] if len(stats) == 1 else agg
        intervals = [w.interval() for w in self.windows]
        main_interval = intervals[0] if len(intervals) == 1 else merge_deltas([d for d in intervals if d is not None])
        self._history.append(history_point(t, main, main_interval))
        self.verdict = self.left_out.applied(self.tracker.update(tuple(self._history)), self.tick, t)
        return self._frame(stats, agg, found)

    def frame(self) -> AttachFrame:
        return self._frame(*self._stats())

    def _stats(self) -> tuple[list[ReplicaStats], ReplicaStats, tuple[Imbalance, ...]]:
        stats = [with_readings(build_stats(w.url, w.status, w.reason, w.latest, w.interval(), w.window(),
                                           user_max_num_seqs=self.max_num_seqs, estimate=self.estimate,
                                           resets=w.resets))
                 for w in self.windows]
        agg = with_readings(aggregate(stats, [w.window() for w in self.windows], [w.interval() for w in self.windows]))
        return stats, agg, tuple(imbalances(stats))

    def _frame(self, stats: list[ReplicaStats], agg: ReplicaStats, found: tuple[Imbalance, ...]) -> AttachFrame:
        history = tuple(self._history)
        main = stats[0] if len(stats) == 1 else agg
        return AttachFrame(self.t, self.tick, tuple(stats), agg, found, history,
                           main_readings(main, self.verdict, history, found), self.verdict)
