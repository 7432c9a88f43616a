"""Run time paced against wall time: a what-if engine's simulated seconds, or a recording's, played a
chosen number of times as fast as the wall clock (< and > change it)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from batchtop.core_engine.simulate.clock import VirtualClock

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0, math.inf)  # the one speed table
BEHIND_S = 0.25  # wall seconds a run may fall behind its pace before the pace gives up on it


class WallPace:
    """Lets simulated time run `speed` times as fast as wall time (math.inf: as fast as it can).

    When simulating takes longer than the pace allows (a large batch on a slow host), it runs as
    fast as it can and `behind` says so; it never races afterwards to catch up."""

    def __init__(self, clock: VirtualClock, speed: float = 1.0, wall: Callable[[], float] = time.monotonic,
                 max_speed: float = math.inf) -> None:
        """max_speed: the fastest step of SPEEDS that `>` reaches (a recording plays at most 64x)."""
        self.clock = clock
        self.speed = speed
        self.speeds = tuple(s for s in SPEEDS if s <= max_speed)
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
        self.set_speed(next((s for s in self.speeds if s > self.speed), self.speeds[-1]))
        return self.speed

    def slower(self) -> float:
        self.set_speed(next((s for s in reversed(self.speeds) if s < self.speed), self.speeds[0]))
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

    def wall_seconds(self, run_seconds: float) -> float:
        """RunTime: an idle loop waits for an event this far away."""
        return self.idle(run_seconds)

    def idle(self, wait: float) -> float:
        """Nothing runs until something `wait` simulated seconds away: move the clock toward it as far
        as wall time allows; returns the wall seconds left until it is reached."""
        step = wait if math.isinf(self.speed) else min(wait, max(0.0, self._allowed() - self.clock()))
        self.clock.advance(step)
        return 0.0 if math.isinf(self.speed) else (wait - step) / self.speed
