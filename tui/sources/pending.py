"""Keys the engine has not applied yet. The engine takes a control at the start of its next step, which
may be a minute away on a first step; the status line shows what was asked for from the moment the key
is pressed ("max_num_seqs=16 → 32 (at next step)") until a published frame shows the engine's value.

The keys' commands are relative (`+` adds one to the value in force when applied), so what is pending is
the frame's value with every command the engine has not taken folded in, as the engine will fold them.
"""

from __future__ import annotations

import threading
from collections import deque

from batchtop.core_engine.engine import control
from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.core_engine.run.frame import NOTHING, Pending  # what a frame carries; folded here
from batchtop.core_engine.sched.policies import next_mode


def fold(mode: str, max_num_seqs: int, cap: int, commands: tuple[control.Command, ...]) -> tuple[str, int]:
    """The mode and max_num_seqs once the engine has applied `commands` in order (Engine.apply's rules)."""
    for cmd in commands:
        if isinstance(cmd, control.ToggleMode):
            mode = next_mode(mode)
        elif isinstance(cmd, control.ChangeMaxNumSeqs):
            max_num_seqs = max(1, min(cap, int(max_num_seqs * cmd.multiply) + cmd.add))
    return mode, max_num_seqs


def pending_over(snap: StepSnapshot | None, state: str, unapplied: tuple[control.Command, ...], paused: bool,
                 cap: int, in_flight: bool = False) -> Pending:
    """What a frame (its snapshot and state) lacks of the keys: the commands it does not show applied
    (in_flight: the step in flight took them all), and a pause or resume the engine thread has not
    published (the loop takes those at once, but the frame says so only when the step in flight ends)."""
    pause = True if paused and state == "running" else False if not paused and state == "paused" else None
    if snap is None or (not unapplied and pause is None):
        return NOTHING
    mode, max_num_seqs = fold(snap.mode, snap.max_num_seqs, cap, unapplied)
    return Pending(mode if mode != snap.mode else None, max_num_seqs if max_num_seqs != snap.max_num_seqs else None,
                   pause, in_flight)


class SentControls:
    """The keys' commands in the order sent (UI thread), numbered, so the engine thread can say how many
    it had been sent when a step began: those, and only those, that step applied (it drains the queue
    first thing)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._unapplied: deque[tuple[int, control.Command]] = deque()

    def send(self, submit, command: control.Command) -> None:
        """Number the command and hand it to `submit` (Engine.submit) as one act, so a step cannot begin
        between the two."""
        with self._lock:
            self._unapplied.append((self._count, command))
            self._count += 1
            submit(command)

    @property
    def count(self) -> int:
        """How many have been sent (a step began after the first `count` of them has them all)."""
        return self._count

    def mark(self) -> int:
        """The engine thread, right before the engine drains its control queue: how many were sent."""
        with self._lock:
            return self._count

    def after(self, taken: int) -> tuple[control.Command, ...]:
        """The commands sent after the first `taken` (those a frame published with that mark lacks)."""
        with self._lock:
            while self._unapplied and self._unapplied[0][0] < taken:  # marks only grow: gone for good
                self._unapplied.popleft()
            return tuple(cmd for _, cmd in self._unapplied)
