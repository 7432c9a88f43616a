"""Runs the live engine on a worker thread and publishes frames; the UI only reads and sends commands.

Nothing here touches a widget: the UI polls `frame` on a timer, and rare events (an engine crash, the
workload finishing) go through the `notify` callback, which the app turns into Textual messages.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable

from batchtop.core_engine.engine import control
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.run.session import Session
from batchtop.core_engine.run.pace import WallPace
from batchtop.tui.sources.frame import DashboardFrame, FrameBuilder

PUBLISH_INTERVAL_S = 0.1  # the UI polls at 10 Hz: a frame more often would be built for nobody
IDLE_WAIT_S = 0.05

Notify = Callable[[str, str], None]  # (kind, text): kind is "error", "finished" or "quit"


class EngineBridge:
    def __init__(self, engine: Engine, requests: list[Request], *, start_paused: bool = False,
                 notify: Notify | None = None, session: Session | None = None, serving: bool = False,
                 pace: WallPace | None = None) -> None:
        self.engine = engine
        self.serving = serving  # a server's engine: out of work it is idle, waiting for requests, not finished
        self.pace = pace  # a what-if engine: its simulated time kept to a multiple of wall time
        self.requests = requests
        self.session = session or Session(engine, requests)
        engine.load_workload(requests)
        self.notify: Notify = notify or (lambda kind, text: None)
        self._builder = FrameBuilder()
        self._builder.observe(engine.snapshot())  # empty slots and the queue-to-be, before the first step
        self._paused = start_paused
        self._pending_steps = 0
        self._restart = False
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._last_publish = 0.0
        self._recorded_pause = start_paused
        self.stop_requested = False
        self.started = threading.Event()  # set once the engine thread has entered run()
        self.done = threading.Event()  # set once the engine thread has left its loop
        self.runs = 1  # restarts so far + 1
        self.error: str | None = None
        self._finished_announced = False
        self.frame: DashboardFrame = self._builder.frame(self._state())

    @property
    def collector(self):
        """Metrics of the current run so far (read it once the engine thread has stopped or paused)."""
        return self._builder.collector

    # -- controls: called from the UI thread --------------------------------------------------
    @property
    def paused(self) -> bool:
        return self._paused

    # Relative commands: the engine applies each to the value in force then, so presses faster than
    # frames (or a script's change in between) compose instead of repeating a stale frame's value.
    def toggle_mode(self) -> None:
        self._send(control.ToggleMode())

    def change_max_num_seqs(self, add: int = 0, multiply: float = 1.0) -> None:
        self._send(control.ChangeMaxNumSeqs(add, multiply))

    @property
    def max_num_seqs_cap(self) -> int:
        return self.engine.max_num_seqs_cap

    def current_max_num_seqs(self) -> int:
        snap = self.frame.snapshot
        return snap.max_num_seqs if snap is not None else self.engine.max_num_seqs

    def toggle_pause(self) -> bool:
        self._paused = not self._paused
        self._wake.set()
        return self._paused

    def step_once(self) -> None:
        with self._lock:
            self._pending_steps += 1
        self._wake.set()

    def burst(self, count: int | None = None) -> int:
        with self._lock:  # the script may burst from the engine thread at the same time
            n = self.session.burst(count or max(8, self.current_max_num_seqs()))
        self._wake.set()
        return n

    def wake(self) -> None:
        """Thread-safe: work has arrived (a server's request); an idle engine thread starts at once."""
        self._wake.set()

    def restart(self) -> None:
        self._restart = True
        self._wake.set()

    def _send(self, command: control.Command) -> None:
        self.engine.submit(command)
        self._wake.set()

    # -- the engine thread ----------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the engine thread to finish its step and leave; `done` is set when it has."""
        self.stop_requested = True
        self._wake.set()

    def run(self, is_cancelled: Callable[[], bool]) -> None:
        """The worker body: step while running, wait while paused or done, stop when cancelled."""
        self.started.set()
        try:
            while not (is_cancelled() or self.stop_requested or self.session.quit_requested):
                self._loop_once()
            self.session.close("script quit" if self.session.quit_requested else "quit")
            if self.session.quit_requested:
                self.notify("quit", "the script has ended the demo")
        except Exception as exc:  # the engine is dead; the UI stays up and says why
            self.error = f"{type(exc).__name__}: {exc}"
            self._publish(force=True, sample=False)
            self.session.close("error", self.error)
            self.notify("error", self.error + "\n" + traceback.format_exc(limit=6))
        finally:
            self.done.set()

    def shut_down(self, reason: str, wait_s: float) -> None:
        """However the app ended (a signal before it drew, a step that outlived the quit's wait): stop
        the engine thread, give it `wait_s` to close the session itself, then close what is still open
        (the recorder takes a close from any thread; the engine thread writes nothing after it)."""
        self.stop()
        if self.started.is_set():
            self.done.wait(wait_s)
        recorder = self.session.recorder
        if recorder is not None and not recorder.closed:
            self.session.close(reason)

    def _loop_once(self) -> None:
        if self._recorded_pause != self._paused:
            self._recorded_pause = self._paused
            self.session.note("pause" if self._paused else "resume")
        if self._restart:
            self._restart = False
            self.engine.submit(control.Reset())
            self.engine.apply_pending()
            snap = self.engine.snapshot()
            self.session.after_step(snap)
            self._builder = FrameBuilder()
            self._builder.observe(snap)
            self._finished_announced = False
            self.runs += 1
        with self._lock:
            single = self._pending_steps > 0
        if not self._paused:
            with self._lock:
                self.session.before_step()
        if (self._paused and not single) or (self.engine.is_done() and not single):
            self._idle()
            return
        if self.pace is not None and not single and (ahead := self.pace.ahead_s()) > 0:
            self._wake.wait(min(ahead, IDLE_WAIT_S))  # simulated time is ahead of its pace
            self._wake.clear()
            return
        snap = self.engine.step()
        if single:
            with self._lock:
                self._pending_steps -= 1
        self._builder.observe(snap, self.session.after_step(snap))
        if not snap.is_step:
            wait = self.session.seconds_until_next_event()
            self._publish(force=single, sample=False)
            if wait and self.pace is not None:
                wait = self.pace.idle(wait)  # the virtual clock moves on as far as wall time allows
            if wait:
                self._wake.wait(min(wait, IDLE_WAIT_S))
                self._wake.clear()
            return
        self._publish(force=single)

    def _idle(self) -> None:
        """Apply controls sent while paused (so the status line follows at once) and wait."""
        if self.engine.apply_pending():
            snap = self.engine.snapshot()
            self._builder.observe(snap, self.session.after_step(snap))
        if self.pace is not None:
            wait = None if self._paused else self.session.seconds_until_next_event()
            if wait:
                self.pace.idle(wait)  # a script action still to come: simulated time goes on
            else:
                self.pace.hold()  # time paused or idle is not made up for afterwards
        if (self.engine.is_done() and not self.serving and not self._finished_announced
                and self._builder.last is not None):
            self._finished_announced = True
            self.notify("finished", "workload finished — press r to run it again")
        self._publish(force=True, sample=False)
        self._wake.wait(0.1)
        self._wake.clear()

    def _state(self) -> str:
        if self.error is not None:
            return "error"
        if self._paused:
            return "paused"
        if self.engine.is_done():
            return "idle" if self.serving else "finished"
        return "running"

    def _publish(self, force: bool = False, sample: bool = True) -> None:
        now = time.monotonic()
        if not force and now - self._last_publish < PUBLISH_INTERVAL_S:
            return
        self._last_publish = now
        if sample:
            self._builder.sample_rate()
        self.frame = self._builder.frame(self._state(), self.error, self.session.caption)
