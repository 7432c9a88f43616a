"""Simulated time: a clock that moves only when a modelled step or a wait moves it, and, for the
dashboard, a pace that keeps it a chosen number of times as fast as wall time."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0, math.inf)
BEHIND_S = 0.25  # wall seconds the simulation may fall behind its pace before the pace gives up on it


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


class WallPace:
    """Lets simulated time run `speed` times as fast as wall time (math.inf: as fast as it can).

    When simulating takes longer than the pace allows (a large batch on a slow host), it runs as
    fast as it can and `behind` says so; it never races afterwards to catch up."""

    def __init__(self, clock: VirtualClock, speed: float = 1.0, wall: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.speed = speed
        self._wall = wall
        self.behind = False
        self.hold()

    def hold(self) -> None:
        """Start the pace from here: time spent paused or changing speed is not made up for."""
        self._sim0, self._wall0 = self.clock(), self._wall()

    def set_speed(self, speed: float) -> None:
        self.speed = speed
        self.hold()

    def faster(self) -> float:
        self.set_speed(next((s for s in SPEEDS if s > self.speed), SPEEDS[-1]))
        return self.speed

    def slower(self) -> float:
        self.set_speed(next((s for s in reversed(SPEEDS) if s < self.speed), SPEEDS[0]))
        return self.speed

    def _allowed(self) -> float:
        """The simulated time wall time has reached at this pace."""
        return self._sim0 + (self._wall() - self._wall0) * self.speed

    def ahead_s(self) -> float:
        """Wall seconds to wait before the simulation may take its next step (0: go now)."""
        if math.isinf(self.speed):
            return 0.0
        ahead = (self.clock() - self._allowed()) / self.speed
        self.behind = ahead < -BEHIND_S
        if self.behind:
            self.hold()
        return max(0.0, ahead)

    def idle(self, wait: float) -> float:
        """Nothing runs until something `wait` simulated seconds away: move the clock toward it as far
        as wall time allows; returns the wall seconds left until it is reached."""
        step = wait if math.isinf(self.speed) else min(wait, max(0.0, self._allowed() - self.clock()))
        self.clock.advance(step)
        return 0.0 if math.isinf(self.speed) else (wait - step) / self.speed
