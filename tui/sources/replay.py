"""Replays a trace into the dashboard: recorded snapshots go through the same FrameBuilder the live
bridge uses, at recorded speed, so the panels cannot tell live from replay."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.core_engine.engine.detokenizer import TextDelta
from batchtop.core_engine.trace.trace import Trace
from batchtop.tui.sources.frame import DashboardFrame, FrameBuilder

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


class ReplaySource:
    def __init__(self, trace: Trace, *, speed: float = 1.0, start_paused: bool = False) -> None:
        self.trace = trace
        self.items: list[tuple[dict, StepSnapshot | None]] = list(trace.snapshots())
        self.num_steps = sum(1 for _, snap in self.items if snap is not None and snap.is_step)
        self.duration = self.items[-1][0]["t"] if self.items else 0.0
        self.speed = speed
        self.paused = start_paused
        self.notify: Callable[[str, str], None] = lambda kind, text: None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._seek: int | None = None
        self._single = 0
        self.stop_requested = False
        self.done = threading.Event()
        self._reset_state()
        self.frame: DashboardFrame = self._frame()

    def _reset_state(self) -> None:
        self.pos = 0  # next item to play
        self.clock = 0.0  # replay time, in the recording's seconds
        self.caption: str | None = None
        self.recorded_pause = False
        self._builder = FrameBuilder()

    # -- controls (UI thread) -------------------------------------------------------------------
    def toggle_pause(self) -> bool:
        self.paused = not self.paused
        self._wake.set()
        return self.paused

    def faster(self) -> float:
        self.speed = next((s for s in SPEEDS if s > self.speed), SPEEDS[-1])
        return self.speed

    def slower(self) -> float:
        self.speed = next((s for s in reversed(SPEEDS) if s < self.speed), SPEEDS[0])
        return self.speed

    def step_once(self) -> None:
        with self._lock:
            self._single += 1
        self._wake.set()

    def seek_start(self) -> None:
        self._seek = 0
        self._wake.set()

    def seek_end(self) -> None:
        self._seek = len(self.items)
        self._wake.set()

    # -- the replay thread ----------------------------------------------------------------------
    def stop(self) -> None:
        self.stop_requested = True
        self._wake.set()

    def run(self, is_cancelled: Callable[[], bool]) -> None:
        try:
            self._run(is_cancelled)
        finally:
            self.done.set()

    def _run(self, is_cancelled: Callable[[], bool]) -> None:
        last = time.monotonic()
        while not (is_cancelled() or self.stop_requested):
            now = time.monotonic()
            elapsed, last = now - last, now
            if self._seek is not None:
                self._do_seek(self._seek)
                continue
            with self._lock:
                single = self._single > 0
                if single:
                    self._single -= 1
            if single:
                self._play_until_step()
            elif not self.paused and self.pos < len(self.items):
                self.clock += elapsed * self.speed
                while self.pos < len(self.items) and self.items[self.pos][0]["t"] <= self.clock:
                    self._play(self.pos)
            self.frame = self._frame()
            self._wake.wait(0.03)
            self._wake.clear()

    def _play(self, index: int) -> None:
        event, snap = self.items[index]
        self.pos = index + 1
        if event["type"] == "control":
            if event["name"] == "caption":
                self.caption = event["value"]
            elif event["name"] in ("pause", "resume"):
                self.recorded_pause = event["name"] == "pause"
            elif event["name"] == "reset":
                self._builder = FrameBuilder()
        elif event["type"] == "text":  # recorded with --record-text; checked when the trace was read
            self._builder.texts.add(TextDelta.from_event(event))
        elif event["type"] == "error":
            self.notify("error", f"the recorded engine failed: {event['message']}")
        if snap is not None:
            self._builder.observe(snap)
            self._builder.sample_rate()

    def _play_until_step(self) -> None:
        while self.pos < len(self.items):
            self._play(self.pos)
            snap = self.items[self.pos - 1][1]
            if snap is not None and snap.is_step:
                break
        self.clock = self.items[self.pos - 1][0]["t"] if self.pos else 0.0

    def _do_seek(self, target: int) -> None:
        self._seek = None
        self._reset_state()
        for index in range(min(target, len(self.items))):
            self._play(index)
        self.clock = self.items[self.pos - 1][0]["t"] if self.pos else 0.0
        self.frame = self._frame()

    def _frame(self) -> DashboardFrame:
        state = "paused" if self.paused else "finished" if self.pos >= len(self.items) else "replay"
        return self._builder.frame(state, None, self.caption)

    def position(self) -> str:
        snap = self.frame.snapshot
        step = snap.counters.steps if snap is not None else 0
        return f"REPLAY {self.speed:g}x · step {step}/{self.num_steps} · {self.clock:.1f}/{self.duration:.1f}s"
