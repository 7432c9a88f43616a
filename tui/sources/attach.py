"""Where the attach dashboard's frames come from: live scrapes on a timer, or a recording played back
at its own pace. Both run on a worker thread and hand each frame to the UI; neither touches a widget."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from batchtop.core_engine.attach.monitor import AttachFrame, Monitor
from batchtop.core_engine.attach.poller import LivePoller
from batchtop.core_engine.attach.record import monitor_for, recorded_ticks
from batchtop.core_engine.trace.trace import Trace

if TYPE_CHECKING:
    from batchtop.tui.cli.attach import AttachSetup

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0)


def _sleep_until(deadline: float, cancelled: Callable[[], bool], wake: threading.Event) -> None:
    while not cancelled():
        left = deadline - time.monotonic()
        if not left > 0:  # NaN too: a wait that never ends would spin, not sleep
            return
        wake.wait(min(left, 0.05))
        wake.clear()


class LiveFeed:
    LIVE = True

    def __init__(self, setup: AttachSetup) -> None:
        self.setup = setup
        self.monitor: Monitor = setup.monitor()
        self.label = "live"
        self._wake = threading.Event()

    def run(self, on_frame: Callable[[AttachFrame], None], cancelled: Callable[[], bool]) -> None:
        opts = self.setup.opts
        poller = LivePoller(self.setup.urls, opts.interval, opts.timeout_s)
        recorder = self.setup.recorder()
        frame = self.monitor.frame()
        start = time.monotonic()
        try:
            while not cancelled():
                results, t = poller.poll()
                frame = self.monitor.feed(results, t)
                if recorder is not None:
                    recorder.tick(frame.tick, t, results)
                on_frame(frame)
                _sleep_until(start + frame.tick * opts.interval, cancelled, self._wake)
        finally:
            poller.close()
            if recorder is not None:
                recorder.close(frame.t, "finished")

    def status(self) -> str:
        rec = f" · recording {self.setup.opts.record}" if self.setup.opts.record else ""
        return f"● live every {self.setup.opts.interval:g}s{rec}"

    def stop(self) -> None:
        self._wake.set()


class ReplayFeed:
    LIVE = False

    def __init__(self, trace: Trace, speed: float = 1.0) -> None:
        self.trace = trace
        self.ticks = list(recorded_ticks(trace))
        self.monitor = monitor_for(trace)
        self.speed = speed
        self.paused = False
        self.position = 0
        self._step = False
        self._wake = threading.Event()

    def run(self, on_frame: Callable[[AttachFrame], None], cancelled: Callable[[], bool]) -> None:
        last_t, last_wall = None, time.monotonic()
        while not cancelled() and self.position < len(self.ticks):
            if self.paused and not self._step:
                self._wake.wait(0.05)
                self._wake.clear()
                last_wall = time.monotonic()
                continue
            t, results = self.ticks[self.position]
            if last_t is not None and not self._step:
                _sleep_until(last_wall + (t - last_t) / self.speed, cancelled, self._wake)
                if self.paused and not self._step:
                    continue
            self._step = False
            self.position += 1
            last_t, last_wall = t, time.monotonic()
            on_frame(self.monitor.feed(results, t))

    def status(self) -> str:
        state = "‖ paused" if self.paused else ("■ end of recording" if self.position >= len(self.ticks) else "▶ replay")
        return f"{state} {self.position}/{len(self.ticks)} scrapes at {self.speed:g}x · {self.trace.path}"

    def toggle_pause(self) -> None:
        self.paused = not self.paused
        self._wake.set()

    def step_once(self) -> None:
        self.paused, self._step = True, True
        self._wake.set()

    def faster(self) -> float:
        self.speed = next((s for s in SPEEDS if s > self.speed), SPEEDS[-1])
        self._wake.set()
        return self.speed

    def slower(self) -> float:
        self.speed = next((s for s in reversed(SPEEDS) if s < self.speed), SPEEDS[0])
        self._wake.set()
        return self.speed

    def stop(self) -> None:
        self._wake.set()
