"""The one engine loop: every driver steps its run through it — `--headless` and `compare` until the
work is done; `serve`, the dashboards and replay until they are stopped; what-if and replay at a pace.

One iteration: stopped? -> calls queued by other threads (restart, seek, a burst) -> the script's due
actions -> one step, or a wait until the next event (an arrival, a script action, a recorded step) or
a wake-up. Pause and single-step hold back the step, never the calls; the run is closed (and with it
its trace) however the loop ends. Only this loop and the measurement probes call `engine.step()`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from batchtop.core_engine.engine.detokenizer import TextDelta
from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.core_engine.simulate.clock import VirtualClock

POLL_S = 0.05  # longest wait between looks at the stop flag and the calls (Ctrl-C, keys stay responsive)


@dataclass(frozen=True, slots=True)
class Stepped:
    """What one step (or a view between steps) produced: the snapshot and the text it added."""

    snapshot: StepSnapshot
    text: TextDelta | None = None

    @property
    def is_step(self) -> bool:
        return self.snapshot.is_step


class Stepper(Protocol):
    """What the loop steps: a live Session over an engine, or a recorded session played back."""

    quit_requested: bool  # a script's last action ends the loop

    def before_step(self) -> None:
        """Due script actions: they apply at the start of the coming step."""

    def step(self, forced: bool) -> Stepped | None:
        """One step (forced: a single step asked for by hand); None or a view when nothing was due."""

    def is_done(self) -> bool: ...

    def seconds_until_next_event(self) -> float | None:
        """Run seconds until something is due (an arrival, a script action); None: nothing is coming."""

    def apply_controls(self) -> Stepped | None:
        """Controls sent while paused or idle, applied now: a view showing them, or None."""

    def restart(self) -> Stepped | None:
        """Start over: the view that shows it (None: the next step will)."""

    def note(self, name: str, value: object = None) -> None: ...

    def close(self, reason: str, error: str | None = None) -> None: ...


class RunTime(Protocol):
    """How run time passes while the loop waits: with the wall clock, jumped, or paced against it."""

    def wall_seconds(self, run_seconds: float) -> float:
        """Let run time move toward an event run_seconds away; the wall seconds left to wait for it."""

    def ahead_s(self) -> float:
        """Wall seconds the run must wait before its next step (0: step now)."""

    def hold(self) -> None:
        """Time spent paused or idle is not made up for afterwards."""


class WallTime:
    """Run time is wall time: wait the whole way."""

    def wall_seconds(self, run_seconds: float) -> float:
        return run_seconds

    def ahead_s(self) -> float:
        return 0.0

    def hold(self) -> None:
        pass


class JumpTime:
    """A virtual clock with no one watching: jump it to the event instead of waiting."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock

    def wall_seconds(self, run_seconds: float) -> float:
        self.clock.advance(run_seconds)
        return 0.0

    def ahead_s(self) -> float:
        return 0.0

    def hold(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class LoopEnd:
    reason: str  # finished | script quit | error | the driver's stop_reason (quit, shutdown, interrupted)
    error: BaseException | None = None

    @property
    def error_text(self) -> str | None:
        return None if self.error is None else f"{type(self.error).__name__}: {self.error}"


OnStep = Callable[[Stepped, bool], None]  # (what the step produced, whether it was a single step by hand)


class RunLoop:
    def __init__(self, stepper: Stepper, *, until_done: bool, time: RunTime | None = None, stop_reason: str = "quit",
                 on_step: OnStep | None = None, on_idle: Callable[[], None] | None = None,
                 on_restart: Callable[[Stepped | None], None] | None = None, paused: bool = False,
                 max_wait_s: float | None = POLL_S) -> None:
        """until_done: end when the run has nothing left to do (else idle until stopped). max_wait_s:
        the longest single wait (None: an idle server sleeps until woken)."""
        self.stepper = stepper
        self.until_done = until_done
        self.time = time or WallTime()
        self.stop_reason = stop_reason
        self.on_step = on_step or (lambda item, forced: None)
        self.on_idle = on_idle or (lambda: None)
        self.on_restart = on_restart or (lambda item: item is not None and self.on_step(item, False))
        self.max_wait_s = max_wait_s
        self.done = threading.Event()  # set once the loop has ended and closed its run
        self._paused = paused
        self._noted_pause = paused
        self._stop = False
        self._singles = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()

    # -- from any thread ------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        return self._paused

    def toggle_pause(self) -> bool:
        self._paused = not self._paused
        self._wake.set()
        return self._paused

    def step_once(self) -> None:
        with self._lock:
            self._singles += 1
        self._wake.set()

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run fn on the loop's thread before its next step (paused or not)."""
        self._calls.put(fn)
        self._wake.set()

    def restart(self) -> None:
        self.call_soon(lambda: self.on_restart(self.stepper.restart()))

    def wake(self) -> None:
        """Work has arrived (a served request, a control): an idle loop looks at once."""
        self._wake.set()

    def stop(self) -> None:
        """End after the step in flight; `done` is set once the run is closed."""
        self._stop = True
        self._wake.set()

    # -- the loop's thread ------------------------------------------------------------------------
    def run(self, should_stop: Callable[[], bool] | None = None) -> LoopEnd:
        """Loop until the run ends; never raises for an engine error, nor for a trace that fails as the run
        closes (a second Ctrl-C still unwinds)."""
        end = LoopEnd(self.stop_reason)
        try:
            while (result := self._iterate(should_stop)) is None:
                pass
            end = result
        except Exception as exc:  # the engine is dead: say why, keep what was measured
            end = LoopEnd("error", exc)
        except BaseException:  # KeyboardInterrupt: close the run, then let it unwind
            end = LoopEnd("interrupted")
            raise
        finally:
            try:
                self.stepper.close(end.reason, end.error_text)
            except Exception as exc:  # the trace failed as it closed: the run's first error is the one to tell
                if end.error is None:
                    end = LoopEnd("error", exc)
            finally:
                self.done.set()
        return end

    def _iterate(self, should_stop: Callable[[], bool] | None) -> LoopEnd | None:
        self._wake.clear()  # before looking for work, so a wake-up that comes after is kept
        if self.until_done and not self._paused and self.stepper.is_done():
            return LoopEnd("finished")
        if self._stop or (should_stop is not None and should_stop()):
            return LoopEnd(self.stop_reason)
        self._note_pause()
        while not self._calls.empty():
            self._calls.get_nowait()()
        with self._lock:
            single = self._singles > 0
        if not self._paused:
            self.stepper.before_step()
            if self.stepper.quit_requested:
                return LoopEnd("script quit")
        if (self._paused or self.stepper.is_done()) and not single:
            if self.until_done and not self._paused:
                return LoopEnd("finished")
            self._idle()
            return None
        if not single and (ahead := self.time.ahead_s()) > 0:
            self._wait(ahead)  # a paced run is ahead of its pace
            return None
        item = self.stepper.step(single)
        if single:
            with self._lock:
                self._singles -= 1
        if item is not None:
            self.on_step(item, single)
        if item is None or not item.is_step:
            wait = self.stepper.seconds_until_next_event()
            if wait:
                self._wait(self.time.wall_seconds(wait))
        return None

    def _idle(self) -> None:
        """Paused, or out of work: show controls sent meanwhile, let paced time run toward a script
        action still to come (or hold it), and wait."""
        item = self.stepper.apply_controls()
        if item is not None:
            self.on_step(item, False)
        wait = None if self._paused else self.stepper.seconds_until_next_event()
        if wait:
            wall = self.time.wall_seconds(wait)
        else:
            self.time.hold()
            wall = None
        self.on_idle()
        self._wait(wall)

    def _wait(self, seconds: float | None) -> None:
        """Wait up to `seconds` (None: until woken), at most max_wait_s at a time; a wake-up ends it."""
        if seconds is not None and seconds <= 0:
            return
        cap = self.max_wait_s
        timeout = seconds if cap is None else cap if seconds is None else min(seconds, cap)
        self._wake.wait(timeout)

    def _note_pause(self) -> None:
        if self._noted_pause != self._paused:
            self._noted_pause = self._paused
            self.stepper.note("pause" if self._paused else "resume")
