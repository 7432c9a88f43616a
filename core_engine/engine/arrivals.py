"""Future arrivals: requests of the workload (or a burst) whose arrival time has not come yet."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

from batchtop.core_engine.sched.request import Request


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
