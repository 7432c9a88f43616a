"""What every driver does around engine.step(): play the demo script, inject bursts, record the trace,
and hand every snapshot to its listeners (a server's request streams and its /metrics).

The headless driver, the dashboard's bridge and the server's engine loop each own one Session, so a
scripted demo, a recording or a server behaves the same with or without a screen.
"""

from __future__ import annotations

from typing import Protocol

from batchtop.core_engine.engine import control
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.run.script import ScriptPlayer
from batchtop.core_engine.engine.detokenizer import TextDecoder, TextDelta
from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.core_engine.trace.trace import Recorder
from batchtop.core_engine.workload.spec import make_burst


class SessionListener(Protocol):
    """Called on the engine thread: must be quick and must never block on another thread."""

    def observe(self, snap: StepSnapshot) -> None: ...

    def closed(self, reason: str, error: str | None) -> None: ...


class Session:
    def __init__(self, engine: Engine, workload: list[Request], *, recorder: Recorder | None = None,
                 script: ScriptPlayer | None = None, text: TextDecoder | None = None) -> None:
        self.engine = engine
        self.workload = workload
        self.recorder = recorder
        self.script = script
        self.listeners: list[SessionListener] = []
        self.text = text  # decodes each step's new tokens (a model directory's tokenizer), else None
        self.caption: str | None = None
        self.quit_requested = False
        self._bursts = 0

    def burst(self, count: int) -> int:
        """count new requests with lengths drawn from the workload, arriving now."""
        self._bursts += 1
        batch = make_burst(self.workload, count, seed=self.engine.config.seed + self._bursts,
                           vocab_size=self.engine.config.model.vocab_size, tag=f"burst{self._bursts}")
        self.engine.submit(control.AddRequests(batch))
        return len(batch)

    def before_step(self) -> None:
        """Send the script's due actions; they apply at the start of the coming step."""
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

    def after_step(self, snap: StepSnapshot) -> TextDelta | None:
        """Record the step; returns the text it added (None without a decoder)."""
        delta = self.text.update(self.engine.scheduler.running, snap) if self.text is not None else None
        if self.recorder is not None:
            self.recorder.record(snap, delta)
        for listener in self.listeners:
            listener.observe(snap)
        return delta

    def note(self, name: str, value: object = None) -> None:
        """A driver-level event for the trace: pause, resume, caption."""
        if self.recorder is not None:
            self.recorder.control(name, value)

    def close(self, reason: str, error: str | None = None) -> None:
        if self.recorder is not None:
            if error is not None:
                self.recorder.error(error)
            self.recorder.close(reason)
        for listener in self.listeners:
            listener.closed(reason, error)
