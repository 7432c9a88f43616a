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
        """Move on by a modelled step or a wait; a step that takes no finite time (or takes the clock
        past a float's range) is an error, never a clock stuck at inf that every comparison reads as NaN."""
        if not 0 <= seconds < math.inf:
            raise ValueError(f"a simulated clock moves on by a finite time >= 0, not {seconds!r} s")
        t = self.t + seconds
        if t == math.inf:
            raise ValueError(f"simulated time overflowed: {self.t!r} s + {seconds!r} s")
        # a wait far smaller than the clock's resolution still makes progress, or an idle loop never ends
        self.t = math.nextafter(self.t, math.inf) if seconds and t == self.t else t
