"""The attach loop's state: a window per replica, fed by live scrapes (watch.py) or by a recording, and
the frame every consumer reads (the dashboard, the headless JSON, the replay): per-replica stats, the
aggregate, the imbalance, the verdict on what bounds the batch, a short history of the signals behind
it (which the strip charts draw too), and what the panels show worked out from them (readings.py).
With --vllm-log / --kv-events, the side streams too (streams/): each logged step, and the server's prefix
cache rebuilt from its KV events.
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
from batchtop.core_engine.attach.streams.served_model import local_model
from batchtop.core_engine.attach.streams.step_point import StepPricer
from batchtop.core_engine.attach.streams.stream_state import StreamState, StreamViews
from batchtop.core_engine.attach.streams.stream_tick import NOTHING, StreamTick
from batchtop.core_engine.attach.streams.taps import LinkStatus
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
    streams: StreamViews | None = None  # the logged steps and the prefix cache, with --vllm-log / --kv-events

    @property
    def main(self) -> ReplicaStats:
        """What the single-server panels show: the one replica, or the aggregate of several."""
        return self.replicas[0] if len(self.replicas) == 1 else self.aggregate


class Monitor:
    """Windows and stats for a list of replicas; feed() takes one scrape result per replica per tick."""

    def __init__(self, urls: list[str], *, window_s: float = 30.0, max_num_seqs: int | None = None,
                 estimate: ModelEstimate | None = None, streams: StreamState | None = None) -> None:
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
        self.streams = streams
        self._link: LinkStatus | None = None
        self._served_known = False

    def feed(self, results: list[ScrapeResult], t: float, streams: StreamTick = NOTHING,
             link: LinkStatus | None = None) -> AttachFrame:
        """One tick: a scrape result per replica, and what the side streams delivered since the last."""
        self.tick += 1
        for window, result in zip(self.windows, results):
            window.add(result)
            self.left_out.saw(self.tick, t, window.url, window.status, window.reason)
        last_t, self.t, self._link = self.t, t, link
        stats, agg, found = self._stats()
        main = stats[0] if len(stats) == 1 else agg
        intervals = [w.interval() for w in self.windows]
        main_interval = intervals[0] if len(intervals) == 1 else merge_deltas([d for d in intervals if d is not None])
        logged = None
        if self.streams is not None:
            self._know_server(main)
            self.streams.take(streams)
            if self.streams.steps is not None:
                logged = self.streams.steps.span(last_t if self.tick > 1 else float("-inf"), t,
                                                 budget=main.token_budget, ceiling=main.max_num_seqs)
        self._history.append(history_point(t, main, main_interval, logged))
        self.verdict = self.left_out.applied(self.tracker.update(tuple(self._history)), self.tick, t)
        return self._frame(stats, agg, found)

    def _know_server(self, main: ReplicaStats) -> None:
        """What the side streams need from the server: its KV pool in tokens (a step's context), and,
        once, the served model where it is a local directory (its dims, its tokenizer)."""
        steps = self.streams.steps
        sample = self.windows[0].latest if len(self.windows) == 1 else None
        if steps is not None and sample is not None and sample.num_gpu_blocks and sample.block_size:
            steps.pool_tokens = sample.num_gpu_blocks * sample.block_size
        if self._served_known or not main.model_name:
            return
        self._served_known = True
        estimate, decode = local_model(main.model_name, self.estimate.dtype if self.estimate else "bfloat16")
        if self.streams.decode is None:
            self.streams.decode = decode
        if steps is not None and estimate is not None and (steps.pricer is None or not steps.pricer.known):
            steps.pricer = StepPricer(estimate)

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
        views = self.streams.views(self.t, self._link) if self.streams is not None else None
        return AttachFrame(self.t, self.tick, tuple(stats), agg, found, history,
                           main_readings(main, self.verdict, history, found), self.verdict, views)
