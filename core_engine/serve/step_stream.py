"""The engine's step stream for viewers: the same header + events a `--record` trace holds, encoded ONCE
per step on the engine thread and fanned out to every subscriber through a bounded queue of its own.

A viewer that falls behind (its queue full) loses steps, counted, and is sent a keyframe at the next
step with room: a "sync" control, an arrival event for every request still live, and the step with its
whole block map, so a fresh trace decoder is back in step. A viewer joining mid-run starts the same way
(header, then the keyframe of the latest snapshot). Nothing here ever waits on a viewer: the engine
thread appends to deques and asks the event loop, once per step, to wake the readers.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from batchtop.core_engine.engine.snapshot import StepSnapshot, WaitingView
from batchtop.core_engine.perf.metrics import finite
from batchtop.core_engine.trace.codec import SnapshotEncoder
from batchtop.core_engine.trace.writer import TRACE_FORMAT, TRACE_VERSION

STEPS_PATH = "/batchtop/steps"  # beside /metrics (step_route.py serves it)
QUEUE_STEPS = 64  # steps a subscriber may lag before it drops (a few KB each)
SYNC = "stream_sync"  # the control that opens a keyframe; its value: {"dropped": steps lost so far}


class Subscriber:
    """One viewer's queue of lines: appended by the engine thread, drained by its HTTP response."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps
        self.lines: deque[bytes] = deque()  # whole chunks: a step's lines, a keyframe, the header, the end
        self.dropped = 0  # steps this viewer lost because it did not read them in time
        self.needs_sync = True  # the next chunk must be a keyframe
        self.ended = False  # the end chunk is queued: nothing follows it
        self.wake = asyncio.Event()

    def has_room(self) -> bool:
        return len(self.lines) < self.max_steps

    def offer(self, chunk: bytes | None, keyframe: Callable[[], bytes]) -> None:
        """A step's lines (None: the step wrote none); after a drop, the step's keyframe (built only
        then: a resync is rare, a step is not) instead."""
        if chunk is None and not self.needs_sync:
            return
        if not self.has_room():
            self.dropped += 1
            self.needs_sync = True
            return
        if self.needs_sync:
            self.lines.append(keyframe())
            self.needs_sync = False
        else:
            self.lines.append(chunk)


class StepPublisher:
    """A Session listener (engine thread) and the subscribe/unsubscribe side (any thread)."""

    def __init__(self, header: dict, *, initial: StepSnapshot | None = None, max_steps: int = QUEUE_STEPS) -> None:
        self.max_steps = max_steps
        self._t0 = time.monotonic()
        self._seq = itertools.count(1)
        self._header = self._line({"type": "header", "format": TRACE_FORMAT, "version": TRACE_VERSION,
                                   "start_time": _now_iso(), **finite({**header, "text": False})}, seq=0, t=0.0)
        self._lock = threading.Lock()  # one step's encoding and fan-out against a subscriber joining
        self._latest = initial
        self._encoder: SnapshotEncoder | None = None  # None while nobody watches: nothing is encoded
        self._subscribers: set[Subscriber] = set()
        self._live: dict[str, WaitingView] = {}  # every request a keyframe must announce, by id
        self._ended: set[str] = set()  # finished, aborted or rejected, still shown in a slot
        self._end: bytes | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake_pending = False  # a wake-up is on its way to the loop
        self.num_steps = 0  # snapshots observed
        self._dropped_by_gone = 0  # steps dropped for viewers that have left
        self.num_failures = 0  # snapshots that could not be encoded (skipped, viewers resync)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    @property
    def num_subscribers(self) -> int:
        return len(self._subscribers)

    @property
    def num_dropped(self) -> int:
        """Steps dropped for slow viewers, over every viewer so far."""
        with self._lock:
            return self._dropped_by_gone + sum(sub.dropped for sub in self._subscribers)

    # -- the viewers' side -------------------------------------------------------------------------
    def subscribe(self, max_steps: int | None = None) -> Subscriber:
        """A new viewer: the header and the latest state are queued at once (the end too, after close)."""
        sub = Subscriber(max_steps or self.max_steps)
        with self._lock:
            sub.lines.append(self._header)
            if self._latest is not None:
                sub.lines.append(self._keyframe(self._latest, 0))
            sub.needs_sync = False
            if self._end is not None:
                sub.lines.append(self._end)
                sub.ended = True
            else:
                self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        with self._lock:
            if sub in self._subscribers:
                self._subscribers.discard(sub)
                self._dropped_by_gone += sub.dropped

    # -- the engine thread's side (a Session listener) ----------------------------------------------
    def observe(self, snap: StepSnapshot) -> None:
        with self._lock:
            self.num_steps += 1
            self._track(snap)
            self._latest = snap
            if not self._subscribers:
                self._encoder = None  # the next viewer starts from a keyframe: no deltas to keep
                return
            if self._encoder is None:
                self._encoder = SnapshotEncoder()
            try:
                events = self._encoder.events(snap)
                chunk = self._lines(events) if events else None
            except (ValueError, TypeError):  # a NaN or an unknown type: a bug, never the server's end
                self.num_failures += 1
                self._encoder = None
                for sub in self._subscribers:
                    sub.needs_sync = True
                return
            synced = False
            for sub in self._subscribers:
                synced |= sub.needs_sync
                sub.offer(chunk, lambda: self._keyframe(snap, sub.dropped))  # noqa: B023 (called at once)
            if synced:
                self._encoder = None  # everyone's next step carries the whole block map again
            subscribers = tuple(self._subscribers)
        self._wake(subscribers)

    def closed(self, reason: str, error: str | None) -> None:
        self.end(f"the engine failed: {error}" if error is not None else f"the engine stopped ({reason})")

    def end(self, reason: str) -> None:
        """Thread-safe and idempotent: every viewer gets the end event (past its bound) and nothing more."""
        with self._lock:
            if self._end is not None:
                return
            self._end = self._line({"type": "end", "reason": reason})
            subscribers = tuple(self._subscribers)
            for sub in subscribers:
                sub.lines.append(self._end)
                sub.ended = True
                self._dropped_by_gone += sub.dropped
            self._subscribers.clear()
        if self._loop is not None and subscribers:  # no longer subscribed: woken by name
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is left to read
                self._loop.call_soon_threadsafe(_set_each, subscribers)

    @property
    def ended(self) -> bool:
        return self._end is not None

    # -- inside ------------------------------------------------------------------------------------
    def _track(self, snap: StepSnapshot) -> None:
        """The requests a keyframe must announce: arrived and not yet gone from the slots."""
        if any(name == "reset" for name, _ in snap.controls):
            self._live.clear()
            self._ended.clear()
        for view in snap.arrived:
            self._live[view.request_id] = view
        self._ended.update(f.request_id for f in snap.finished)
        self._ended.update(rid for rid, _ in snap.rejected)
        self._ended.update(str(value) for name, value in snap.controls if name == "abort")
        if self._ended:
            shown = {s.request_id for s in snap.slots if s.request_id is not None}
            for rid in [rid for rid in self._ended if rid not in shown]:
                self._ended.discard(rid)
                self._live.pop(rid, None)

    def _keyframe(self, snap: StepSnapshot, dropped: int) -> bytes:
        """Events that bring a fresh decoder to `snap`: a sync control, the live requests, the step."""
        arrivals = tuple(sorted(self._live.values(), key=lambda v: v.index))
        synced = replace(snap, controls=((SYNC, {"dropped": dropped}),), arrived=arrivals, rejected=(), finished=())
        return self._lines(SnapshotEncoder().events(synced))

    def _lines(self, events: list[dict]) -> bytes:
        t = round(time.monotonic() - self._t0, 6)
        return b"".join(self._line(e, next(self._seq), t) for e in events)

    def _line(self, event: dict, seq: int | None = None, t: float | None = None) -> bytes:
        seq = next(self._seq) if seq is None else seq
        t = round(time.monotonic() - self._t0, 6) if t is None else t
        return json.dumps({"seq": seq, "t": t, **event}, separators=(",", ":"), allow_nan=False).encode() + b"\n"

    def _wake(self, subscribers: tuple[Subscriber, ...]) -> None:
        """One call onto the loop wakes every reader, and none while an earlier one has not run yet."""
        if self._loop is None or not subscribers or self._wake_pending:
            return
        self._wake_pending = True
        try:
            self._loop.call_soon_threadsafe(self._set_all)
        except RuntimeError:  # the loop has closed: nobody is left to read
            self._wake_pending = False

    def _set_all(self) -> None:
        self._wake_pending = False
        with self._lock:
            subscribers = tuple(self._subscribers)
        _set_each(subscribers)


def _set_each(subscribers: tuple[Subscriber, ...]) -> None:
    for sub in subscribers:
        sub.wake.set()


def _now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()
