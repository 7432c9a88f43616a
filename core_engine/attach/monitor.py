"""The attach loop's state: a window per replica, fed by live scrapes or by a recording, and the frame
every consumer reads (the dashboard, the headless JSON, the replay): per-replica stats, the
aggregate, the imbalance and a short history for the strip charts.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass

from batchtop.core_engine.attach.aggregate import Imbalance, aggregate, imbalances
from batchtop.core_engine.attach.roofline_point import ModelEstimate, RooflinePoint
from batchtop.core_engine.attach.scrape import ScrapeResult
from batchtop.core_engine.attach.stats import ReplicaStats, build_stats
from batchtop.core_engine.attach.window import ReplicaWindow

HISTORY = 240  # intervals the strip charts and the roofline trail remember


@dataclass(frozen=True, slots=True)
class HistoryPoint:
    t: float
    running: float | None
    waiting: float | None
    gen_tok_s: float | None
    point: RooflinePoint | None


@dataclass(frozen=True, slots=True)
class AttachFrame:
    t: float  # seconds since the monitor started
    tick: int
    replicas: tuple[ReplicaStats, ...]
    aggregate: ReplicaStats
    imbalances: tuple[Imbalance, ...]
    history: tuple[HistoryPoint, ...]

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

    def feed(self, results: list[ScrapeResult], t: float) -> AttachFrame:
        for window, result in zip(self.windows, results):
            window.add(result)
        self.tick += 1
        self.t = t
        frame = self.frame()
        m = frame.main
        self._history.append(HistoryPoint(t, m.running, m.waiting, m.rates.get("generation_tokens"), m.point))
        return dataclasses.replace(frame, history=tuple(self._history))

    def frame(self) -> AttachFrame:
        stats = [build_stats(w.url, w.status, w.reason, w.latest, w.interval(), w.window(),
                             user_max_num_seqs=self.max_num_seqs, estimate=self.estimate, resets=w.resets)
                 for w in self.windows]
        agg = aggregate(stats, [w.window() for w in self.windows], [w.interval() for w in self.windows])
        return AttachFrame(self.t, self.tick, tuple(stats), agg, tuple(imbalances(stats)), tuple(self._history))
