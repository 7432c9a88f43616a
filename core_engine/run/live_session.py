"""A live run around the engine, as the run loop steps it: play the demo script, inject bursts, record
the trace, decode each step's text, and hand every snapshot to its listeners (a server's request
streams and its /metrics). Headless, serve and the dashboards each step one Session through the same
RunLoop, so a scripted demo, a recording or a server behaves the same with or without a screen.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from batchtop.core_engine.engine import control
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.run.loop import Stepped
from batchtop.core_engine.run.script import ScriptPlayer
from batchtop.core_engine.engine.detokenizer import TextDecoder, TextDelta
from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.core_engine.trace.trace import Recorder
from batchtop.core_engine.trace.writer import TraceWriteError
from batchtop.core_engine.workload.spec import make_burst


class SessionListener(Protocol):
    """Called on the engine thread: must be quick and must never block on another thread."""

    def observe(self, snap: StepSnapshot) -> None: ...

    def closed(self, reason: str, error: str | None) -> None: ...


class Session:
    def __init__(self, engine: Engine, workload: list[Request], *, recorder: Recorder | None = None,
                 script: ScriptPlayer | None = None, text: TextDecoder | None = None,
                 on_record_failure: Callable[[TraceWriteError], None] | None = None) -> None:
        """on_record_failure: None, a trace that cannot be written ends the run at the next step boundary
        (a run's trace is part of its result; the step it failed in still reaches the metrics and the
        listeners); else it is told once and the run goes on unrecorded (a server keeps serving)."""
        self.engine = engine
        self.workload = workload
        self.recorder = recorder
        self.on_record_failure = on_record_failure
        self._record_failure: TraceWriteError | None = None  # raised at the next boundary (policy None)
        self.script = script
        self.listeners: list[SessionListener] = []
        self.text = text  # decodes each step's new tokens (a model directory's tokenizer), else None
        self.caption: str | None = None
        self.quit_requested = False
        self._bursts = 0
        self._burst_lock = threading.Lock()

    def burst(self, count: int) -> int:
        """count new requests with lengths drawn from the workload, arriving now (any thread: a key and
        the script may burst at once, and each burst's ids must be its own)."""
        with self._burst_lock:
            self._bursts += 1
            number = self._bursts
        batch = make_burst(self.workload, count, seed=self.engine.config.seed + number,
                           vocab_size=self.engine.config.model.vocab_size, tag=f"burst{number}")
        self.engine.submit(control.AddRequests(batch))
        return len(batch)

    def before_step(self) -> None:
        """Send the script's due actions; they apply at the start of the coming step."""
        self._raise_record_failure()
        if self.script is None:
            return
        for action in self.script.due(self.engine.now()):
            for command in action.commands():
                self.engine.submit(command)
            if action.burst:
                self.burst(action.burst)
            if action.caption is not None:
                self.caption = action.caption
                self.note("caption", action.caption)
            if action.quit:
                self.quit_requested = True

    def seconds_until_next_event(self) -> float | None:
        """Engine seconds until the next arrival or script action; None when neither is coming."""
        waits = [self.engine.seconds_until_next_arrival()]
        if self.script is not None and self.script.next_at() is not None:
            waits.append(max(0.0, self.script.next_at() - self.engine.now()))
        return min((w for w in waits if w is not None), default=None)

    # -- what the run loop steps (core_engine.run.loop.Stepper) ---------------------------------
    def step(self, forced: bool = False) -> Stepped:
        snap = self.engine.step()
        return Stepped(snap, self.after_step(snap))

    def is_done(self) -> bool:
        return self.engine.is_done()

    def apply_controls(self) -> Stepped | None:
        if not self.engine.apply_pending():
            return None
        snap = self.engine.snapshot()
        return Stepped(snap, self.after_step(snap))

    def restart(self) -> Stepped:
        """The loaded workload again from t=0 (`r` in the dashboard)."""
        self.engine.submit(control.Reset())
        return self.apply_controls()

    def after_step(self, snap: StepSnapshot) -> TextDelta | None:
        """Record the step; returns the text it added (None without a decoder)."""
        delta = self.text.update(self.engine.scheduler.running, snap) if self.text is not None else None
        self._recording(lambda recorder: recorder.record(snap, delta))
        for listener in self.listeners:
            listener.observe(snap)
        return delta

    def note(self, name: str, value: object = None) -> None:
        """A driver-level event for the trace: pause, resume, caption."""
        self._recording(lambda recorder: recorder.control(name, value))

    def close(self, reason: str, error: str | None = None) -> None:
        """Close the trace, then tell the listeners, even when the trace fails: a server whose hub never
        heard the engine stop kept answering /health and left every new request hanging."""
        try:
            if error is not None:
                self._recording(lambda recorder: recorder.error(error))
            self._recording(lambda recorder: recorder.close(reason))
        finally:
            for listener in self.listeners:
                listener.closed(reason, error)
        self._raise_record_failure()  # a trace cut in the last step, or by its end event: the run failed

    def _recording(self, write: Callable[[Recorder], None]) -> None:
        """One write to the trace, under the session's policy for a trace that cannot be written."""
        if self.recorder is None or self.recorder.closed:
            return
        try:
            write(self.recorder)
        except TraceWriteError as exc:
            if self.on_record_failure is not None:
                self.on_record_failure(exc)
            else:
                self._record_failure = exc

    def _raise_record_failure(self) -> None:
        failure, self._record_failure = self._record_failure, None
        if failure is not None:
            raise failure
