"""Attach's frame sources: live scrapes on a timer (core's watch loop, as `--headless` runs it), or a
recording of them played back at its own pace. Both run on the worker thread and publish each frame by
swapping one reference; neither touches a widget or a server socket beyond the scrape itself."""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

from batchtop.core_engine.attach.monitor import AttachFrame, Monitor
from batchtop.core_engine.attach.record.record import monitor_for, recorded_stream_ticks
from batchtop.core_engine.attach.setup import AttachSetup
from batchtop.core_engine.attach.watch import AttachWatch, sleep_until
from batchtop.core_engine.perf.device_peaks import DevicePeaks, peaks_from_dict
from batchtop.core_engine.run.playback_speed import SPEEDS
from batchtop.core_engine.trace.trace import Trace
from batchtop.tui.sources.source import ATTACH_LAYOUT, Notify

MAX_REPLAY_SPEED = 64.0
REPLAY_SPEEDS = tuple(s for s in SPEEDS if s <= MAX_REPLAY_SPEED)


class _AttachSource(ABC):
    layout = ATTACH_LAYOUT
    controls: frozenset[str] = frozenset()

    def __init__(self, monitor: Monitor, peaks: DevicePeaks | None, peaks_note: str) -> None:
        self.monitor = monitor
        self.peaks, self.peaks_note = peaks, peaks_note
        self.frame: AttachFrame | None = None
        self.notify: Notify = lambda kind, text: None
        self.done = threading.Event()
        self._wake = threading.Event()
        self._stop = False

    def run(self, is_cancelled: Callable[[], bool]) -> None:
        try:
            self._run(lambda: self._stop or is_cancelled())
        finally:
            self.done.set()

    @abstractmethod
    def _run(self, cancelled: Callable[[], bool]) -> None:
        """Produce frames until cancelled."""

    def stop(self) -> None:
        self._stop = True
        self._wake.set()

    def act(self, name: str) -> str | None:
        return None


class AttachSource(_AttachSource):
    """Live servers, scraped every --interval."""

    def __init__(self, setup: AttachSetup) -> None:
        super().__init__(setup.monitor(), setup.peaks, setup.peaks_note)
        self.setup = setup

    def _run(self, cancelled: Callable[[], bool]) -> None:
        AttachWatch(self.setup, self.monitor).run(self._show, cancelled=cancelled, wake=self._wake)

    def _show(self, frame: AttachFrame) -> None:
        self.frame = frame

    def status(self, frame: AttachFrame | None) -> str:
        rec = f" · recording {self.setup.opts.record}" if self.setup.opts.record else ""
        return f"● live every {self.setup.opts.interval:g}s{rec}"


class AttachReplaySource(_AttachSource):
    """A recording from `attach --record`, at its recorded pace (space, < >, n)."""

    controls = frozenset({"toggle_pause", "slower", "faster", "next_step"})

    def __init__(self, trace: Trace, speed: float = 1.0) -> None:
        super().__init__(monitor_for(trace), peaks_from_dict(trace.header.get("peaks")),
                         f"{trace.header.get('peaks_note', 'recorded')} (recorded)")
        self.trace = trace
        self.ticks = list(recorded_stream_ticks(trace))
        self.speed = speed
        self.paused = False
        self.position = 0
        self._step = False

    def _run(self, cancelled: Callable[[], bool]) -> None:
        last_t, last_wall = None, time.monotonic()
        while not cancelled() and self.position < len(self.ticks):
            if self.paused and not self._step:
                self._wake.wait(0.05)
                self._wake.clear()
                last_wall = time.monotonic()
                continue
            t, results, streams = self.ticks[self.position]
            if last_t is not None and not self._step:
                sleep_until(last_wall + (t - last_t) / self.speed, cancelled, self._wake)
                if self.paused and not self._step:
                    continue
            self._step = False
            self.position += 1
            last_t, last_wall = t, time.monotonic()
            self.frame = self.monitor.feed(results, t, streams)

    def status(self, frame: AttachFrame | None) -> str:
        state = "‖ paused" if self.paused else ("■ end of recording" if self.position >= len(self.ticks) else "▶ replay")
        return f"{state} {self.position}/{len(self.ticks)} scrapes at {self.speed:g}x · {self.trace.path}"

    def act(self, name: str) -> str | None:
        if name == "toggle_pause":
            self.paused = not self.paused
        elif name == "next_step":
            self.paused, self._step = True, True
        elif name == "faster":
            self.speed = next((s for s in REPLAY_SPEEDS if s > self.speed), REPLAY_SPEEDS[-1])
            self._wake.set()
            return f"replay at {self.speed:g}x"
        elif name == "slower":
            self.speed = next((s for s in reversed(REPLAY_SPEEDS) if s < self.speed), REPLAY_SPEEDS[0])
            self._wake.set()
            return f"replay at {self.speed:g}x"
        self._wake.set()
        return None
