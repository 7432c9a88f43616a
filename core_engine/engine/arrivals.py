"""Future arrivals: requests of the workload (or a burst) whose arrival time has not come yet."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from batchtop.core_engine.sched.request import Request

if TYPE_CHECKING:
    from batchtop.core_engine.engine.snapshot import StepSnapshot


class ArrivalQueue:
    """A heap ordered by arrival time, ties in submission order."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Request]] = []
        self._order = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, requests: Iterable[Request], base: float) -> None:
        """Each request arrives at base + its arrival_s."""
        for r in requests:
            at = base + r.arrival_s
            if not math.isfinite(at):  # it would never arrive, and an idle loop would wait on it forever
                raise ValueError(f"request {r.id!r}: arrival time {at!r} is not a finite number of seconds")
            heapq.heappush(self._heap, (at, self._order, r))
            self._order += 1

    def pop_due(self, now: float) -> list[tuple[float, Request]]:
        """Every (arrival time, request) due by `now`, in arrival order."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            arrival, _, request = heapq.heappop(self._heap)
            out.append((arrival, request))
        return out

    def remove(self, request_id: str) -> bool:
        """Drop a request that has not arrived yet; False when none by that id is waiting to."""
        kept = [entry for entry in self._heap if entry[2].id != request_id]
        if len(kept) == len(self._heap):
            return False
        heapq.heapify(kept)
        self._heap = kept
        return True

    def next_arrival(self) -> float | None:
        return self._heap[0][0] if self._heap else None


class WorkloadFeed(Protocol):
    """When the loaded workload's requests arrive. The plain feed plays their own arrival times; a paced
    one (core_engine.run.arrival_pacing) plays them faster or slower as the run goes, from what it observes."""

    def load(self, requests: tuple[Request, ...]) -> None:
        """Add requests to the workload (they arrive after those loaded before, by their arrival_s)."""

    def restart(self) -> None:
        """The workload again from its first request (a Reset)."""

    def pop_due(self, now: float) -> list[tuple[float, Request]]:
        """Every (run-time arrival, request) due by run time `now`, in arrival order."""

    def next_arrival(self, now: float) -> float | None:
        """The run time the next request is expected at; None when none is left."""

    def remove(self, request_id: str) -> bool: ...

    def __len__(self) -> int: ...

    def observe(self, snap: StepSnapshot) -> None:
        """A step is over: a paced feed adjusts its pace from it."""

    @property
    def speed(self) -> float | None:
        """How many times as fast as recorded the workload plays now; None: at its own times."""


class TimedFeed:
    """The workload at its own arrival times."""

    def __init__(self) -> None:
        self._loaded: list[Request] = []
        self._queue = ArrivalQueue()

    def load(self, requests: tuple[Request, ...]) -> None:
        self._loaded += requests
        self._queue.push(requests, 0.0)

    def restart(self) -> None:
        self._queue = ArrivalQueue()
        self._queue.push(self._loaded, 0.0)

    def pop_due(self, now: float) -> list[tuple[float, Request]]:
        return self._queue.pop_due(now)

    def next_arrival(self, now: float) -> float | None:
        return self._queue.next_arrival()

    def remove(self, request_id: str) -> bool:
        return self._queue.remove(request_id)

    def __len__(self) -> int:
        return len(self._queue)

    def observe(self, snap: StepSnapshot) -> None:
        pass

    @property
    def speed(self) -> float | None:
        return None
