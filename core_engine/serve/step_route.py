"""GET /batchtop/steps: the engine's step stream over HTTP, as NDJSON (the lines of a trace file) or, for
a browser's EventSource, server-sent events (`?format=sse` or `Accept: text/event-stream`).

It sits behind the API key like /v1 (limits.py lets only /health and /metrics through): it names every
request and what it does, step by step, and each viewer costs the server a queue, where /metrics is
one aggregate a scraper pulls. While it has nothing to send it writes a heartbeat every HEARTBEAT_S (a
blank NDJSON line, an SSE comment) so a viewer can tell a quiet engine from a dead server; once the
server drains and its in-flight requests are done, or the engine stops, the stream ends with the
trace's own end event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from batchtop.core_engine.serve.hub import RequestHub
from batchtop.core_engine.serve.step_stream import STEPS_PATH, StepPublisher, Subscriber

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"
HEARTBEAT_S = 1.0
LINGER_S = 0.05  # woken, wait this long for more steps: one write per few steps (a viewer paints at 10 Hz)
MAX_CHUNKS_PER_WRITE = 64  # a viewer behind by many steps gets them in a few writes, not one huge one


def add_step_route(app: FastAPI, publisher: StepPublisher, hub: RequestHub) -> None:
    @app.get(STEPS_PATH)
    async def steps(raw: Request, format: str | None = None) -> StreamingResponse:  # the query is ?format=
        sse = format == "sse" or (format is None and SSE in raw.headers.get("accept", ""))
        sub = publisher.subscribe()
        return StreamingResponse(_stream(publisher, hub, sub, sse), media_type=SSE if sse else NDJSON,
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _stream(publisher: StepPublisher, hub: RequestHub, sub: Subscriber, sse: bool) -> AsyncIterator[bytes]:
    try:
        while True:
            if sub.lines:
                chunks = [sub.lines.popleft() for _ in range(min(len(sub.lines), MAX_CHUNKS_PER_WRITE))]
                yield _framed(b"".join(chunks), sse)
                continue
            if sub.ended:
                return
            if _drained(hub):  # shutting down and nothing left in flight: the last steps have gone out
                publisher.end("the server shut down")
                continue
            sub.wake.clear()
            if sub.lines or sub.ended:  # appended between the check and the clear
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(sub.wake.wait(), HEARTBEAT_S)
                await asyncio.sleep(LINGER_S)
                continue
            yield b": heartbeat\n\n" if sse else b"\n"
    finally:
        publisher.unsubscribe(sub)


def _drained(hub: RequestHub) -> bool:
    return (not hub.accepting or hub.failure is not None) and hub.num_in_flight == 0


def _framed(lines: bytes, sse: bool) -> bytes:
    """NDJSON as written; SSE: one `data:` event per line."""
    if not sse:
        return lines
    return b"".join(b"data: " + line + b"\n\n" for line in lines.splitlines() if line)
