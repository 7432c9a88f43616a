"""Simulated time: a clock that moves only when a modelled step or a wait moves it."""

from __future__ import annotations

import math


class VirtualClock:
    """Simulated seconds. Read by the engine like any clock; the simulated runner advances it by each
    step's modelled time, and an idle driver jumps it to the next arrival instead of sleeping."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ValueError(f"a clock cannot go back or by NaN: {seconds!r}")
        t = self.t + seconds
        # a wait far smaller than the clock's resolution still makes progress, or an idle loop never ends
        self.t = math.nextafter(self.t, math.inf) if seconds and t == self.t else t
