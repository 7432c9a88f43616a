"""The bridge between the engine thread and the server's event loop.

Requests go in through the engine's thread-safe command queue. What each step did to them comes
back from the engine thread as ONE loop.call_soon_threadsafe per step, which fills each request's
asyncio queue: the engine never waits on the loop, and a token reaches its stream as soon as the
step that made it ends, not a step later.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from batchtop.core_engine.engine import control
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.core_engine.serve.protocol import APIError

RETRY_AFTER_S = 1


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """What one step did to one request."""

    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None  # "length" or "stop" when the engine finished it in this step
    error: APIError | None = None  # the request ended without finishing (engine failure, reset, shutdown)
    sent_at: float = 0.0  # time.perf_counter() on the engine thread when the step's events left it


class RequestStream:
    """One in-flight request as the HTTP handler sees it; events arrive in step order."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.created = int(time.time())
        self.queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
        self.ended = False  # finished, failed or aborted: nothing more will come
        self.num_output_tokens = 0

    @property
    def id(self) -> str:
        return self.request.id

    async def events(self) -> AsyncIterator[StreamEvent]:
        """Every event up to and including the one that ends the request."""
        while True:
            event = await self.queue.get()
            self.num_output_tokens += len(event.token_ids)
            yield event
            if event.finish_reason is not None or event.error is not None:
                return


class RequestHub:
    """Owns the in-flight streams; a Session listener on the engine side, a submit/abort API on the loop side."""

    def __init__(self, engine: Engine, *, wake: Callable[[], None], max_waiting: int | None = None) -> None:
        self.engine = engine
        self.wake = wake  # the engine thread may be asleep waiting for work
        self.max_waiting = max_waiting
        self.failure: str | None = None  # the engine's error once it has died
        self.accepting = True
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[str, RequestStream] = {}  # changed on the loop only; the engine thread only reads
        self._in_transit: set[str] = set()  # submitted, not yet seen arriving (added by the loop, removed by the engine)
        self._engine_waiting = 0

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    # -- the event loop's side -------------------------------------------------------------------
    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    @property
    def num_waiting(self) -> int:
        """The engine's queue as of its last step plus requests handed over since."""
        return self._engine_waiting + len(self._in_transit)

    def health(self) -> str | None:
        """None when healthy, else why not."""
        if self.failure is not None:
            return f"the engine has stopped: {self.failure}"
        return None if self.accepting else "the server is shutting down"

    def submit(self, request: Request) -> RequestStream:
        """Hand a validated request to the engine; raises APIError (500 dead engine, 503 full or closing)."""
        if self.failure is not None:
            raise APIError(500, f"the engine has stopped: {self.failure}")
        if not self.accepting:
            raise APIError(503, "the server is shutting down")
        if self.max_waiting is not None and self.num_waiting >= self.max_waiting:
            raise APIError(503, f"the waiting queue is full ({self.num_waiting} waiting, --max-waiting "
                                f"{self.max_waiting}); retry later", headers={"Retry-After": str(RETRY_AFTER_S)})
        stream = RequestStream(request)
        self._streams[stream.id] = stream
        self._in_transit.add(stream.id)
        self.engine.submit(control.AddRequests((request,), "http", self.engine.now()))
        self.wake()
        return stream

    def release(self, stream: RequestStream) -> None:
        """The handler is done with the stream; if the engine still runs the request (the client went
        away, or a stop string ended it), abort it: its KV blocks are freed at the next step."""
        self._streams.pop(stream.id, None)
        if not stream.ended:
            stream.ended = True
            self.engine.submit(control.Abort(stream.id))
            self.wake()

    def fail_all(self, error: APIError) -> None:
        """End every in-flight stream with this error and abort what the engine still runs."""
        for stream in list(self._streams.values()):
            stream.queue.put_nowait(StreamEvent(error=error, sent_at=time.perf_counter()))
            self.release(stream)
        self._in_transit.clear()

    async def drain(self, grace_s: float) -> None:
        """Shutdown: refuse new requests, give in-flight ones grace_s to finish, then end the rest."""
        self.accepting = False
        deadline = time.monotonic() + grace_s
        while self._streams and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.fail_all(APIError(503, "the server shut down before this request finished"))

    def _deliver(self, events: list[tuple[RequestStream, StreamEvent]]) -> None:
        for stream, event in events:
            if stream.ended:
                continue
            if event.finish_reason is not None or event.error is not None:
                stream.ended = True
                self._streams.pop(stream.id, None)
            stream.queue.put_nowait(event)

    def _call_on_loop(self, fn: Callable, *args) -> None:
        if self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop has closed: nobody is left to tell
            pass

    # -- the engine thread's side (a Session listener) ------------------------------------------
    def observe(self, snap: StepSnapshot) -> None:
        streams = self._streams
        for view in snap.arrived:
            self._in_transit.discard(view.request_id)
        self._engine_waiting = snap.num_waiting
        if any(name == "reset" for name, _ in snap.controls):
            self._call_on_loop(self.fail_all, APIError(503, "the engine was reset from the dashboard"))
            return
        now = time.perf_counter()
        tokens: dict[str, list[int]] = {}
        for rid, token in snap.new_tokens:
            if rid in streams:
                tokens.setdefault(rid, []).append(token)
        finished = {f.request_id: f.finish_reason for f in snap.finished if f.request_id in streams}
        events = []
        for rid in tokens.keys() | finished.keys():
            stream = streams.get(rid)
            if stream is not None:
                events.append((stream, StreamEvent(tuple(tokens.get(rid, ())), finished.get(rid), sent_at=now)))
        for rid, reason in snap.rejected:  # validated before submit, so only a changed engine gets here
            self._in_transit.discard(rid)
            if rid in streams:
                events.append((streams[rid], StreamEvent(error=APIError(400, reason), sent_at=now)))
        if events:
            self._call_on_loop(self._deliver, events)

    def closed(self, reason: str, error: str | None) -> None:
        if error is not None:
            self.failure = error
            self._call_on_loop(self.fail_all, APIError(500, f"the engine failed: {error}"))
        else:
            self.accepting = False
            self._call_on_loop(self.fail_all, APIError(503, f"the engine stopped ({reason})"))

