"""A recorded session as the run loop steps it: its snapshots at their recorded times, with the driver
events between them (captions, pause/resume, the recorded text, an engine error)."""

from __future__ import annotations

from collections.abc import Callable

from batchtop.core_engine.engine.detokenizer import TextDelta
from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.core_engine.run.loop import Stepped
from batchtop.core_engine.simulate.clock import VirtualClock
from batchtop.core_engine.trace.trace import Trace


class TracePlayer:
    quit_requested = False  # a recording plays to its end; the viewer quits

    def __init__(self, trace: Trace, on_error: Callable[[str], None] | None = None) -> None:
        self.trace = trace
        self.items: list[tuple[dict, StepSnapshot | None]] = list(trace.snapshots())
        self.num_steps = sum(1 for _, snap in self.items if snap is not None and snap.is_step)
        self.duration = self.items[-1][0]["t"] if self.items else 0.0
        self.clock = VirtualClock()  # replay time, in the recording's seconds; a pace moves it
        self.on_error = on_error or (lambda message: None)
        self._rewind()

    def _rewind(self) -> None:
        self.pos = 0  # the next item to play
        self.clock.t = 0.0
        self.caption: str | None = None
        self.recorded_pause = False

    # -- Stepper ---------------------------------------------------------------------------------
    def before_step(self) -> None:
        pass

    def is_done(self) -> bool:
        return self.pos >= len(self.items)

    def seconds_until_next_event(self) -> float | None:
        if self.is_done():
            return None
        return max(0.0, self.items[self.pos][0]["t"] - self.clock())

    def step(self, forced: bool = False) -> Stepped | None:
        """Play every item due by the clock, up to the next step; forced: the next step whatever its
        time (the clock jumps there). None when nothing was due."""
        played, text = None, None
        while self.pos < len(self.items):
            event, snap = self.items[self.pos]
            if not forced and event["t"] > self.clock():
                break
            self.pos += 1
            if event["type"] == "text":  # recorded with --record-text, before its step
                text = TextDelta.from_event(event)
            else:
                self._driver_event(event)
            if snap is not None:
                played, text = Stepped(snap, text), None
                if snap.is_step:
                    break
        if forced and self.pos:
            self.clock.t = max(self.clock.t, self.items[self.pos - 1][0]["t"])
        return played

    def apply_controls(self) -> Stepped | None:
        return None

    def restart(self) -> None:
        """Back to the start of the recording (`g`); the items at t=0 play on the next iteration."""
        self._rewind()

    def note(self, name: str, value: object = None) -> None:
        pass

    def close(self, reason: str, error: str | None = None) -> None:
        pass

    # -- seeking -----------------------------------------------------------------------------------
    def play_to_end(self) -> list[Stepped]:
        out = []
        while not self.is_done():
            item = self.step(forced=True)
            if item is not None:
                out.append(item)
        return out

    def play_until(self, t: float) -> list[Stepped]:
        """Everything recorded up to t seconds, the clock moved there (an export steps frame by frame)."""
        self.clock.t = max(self.clock.t, t)
        out = []
        while not self.is_done() and self.seconds_until_next_event() == 0.0:
            item = self.step()
            if item is not None:
                out.append(item)
        return out

    def _driver_event(self, event: dict) -> None:
        if event["type"] == "control":
            if event["name"] == "caption":
                self.caption = event["value"]
            elif event["name"] in ("pause", "resume"):
                self.recorded_pause = event["name"] == "pause"
        elif event["type"] == "error":
            self.on_error(f"the recorded engine failed: {event['message']}")
