"""One request's answer, built from its stream of step events: SSE chunks, or one JSON body at the end.

Either way the request is released when its handler ends, so a client that goes away mid-answer has
its request aborted at the next engine step and its KV blocks freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable

from starlette.requests import Request as HTTPRequest

from batchtop.core_engine.serve.exporter import VllmMetrics
from batchtop.core_engine.serve.hub import RequestHub, RequestStream
from batchtop.core_engine.serve.prompts import ServedModel
from batchtop.core_engine.serve.protocol import SamplingBody
from batchtop.core_engine.serve.responses import DONE, Shape, sse
from batchtop.core_engine.serve.text import OutputText

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left before the answer: nobody reads it


class Responder:
    def __init__(self, hub: RequestHub, model: ServedModel, metrics: VllmMetrics) -> None:
        self.hub = hub
        self.model = model
        self.metrics = metrics

    async def stream(self, shape: Shape, stream: RequestStream, body: SamplingBody) -> AsyncIterator[str]:
        """One SSE chunk per engine step, `[DONE]` at the end, the usage chunk before it when asked."""
        head = (stream.id, stream.created, self.model.name)
        text = OutputText(self.model.codec, body.stop)
        failed = False
        try:
            if shape.chat:  # the role comes first, as OpenAI's and vLLM's chat streams do
                yield sse(shape.chunk(*head, "", (), None, body.include_usage, first=True))
            async for event in stream.events():
                if event.error is not None:
                    failed = True
                    yield sse(event.error.body())
                    break
                piece = text.feed(event.token_ids)
                finish = "stop" if text.stopped else event.finish_reason
                if finish is not None and not text.stopped:
                    piece += text.flush()
                self.metrics.delivery.observe(time.perf_counter() - event.sent_at)
                yield sse(shape.chunk(*head, piece, event.token_ids, finish, body.include_usage))
                if text.stopped:
                    self._stopped(stream)
                    break
            if body.include_usage and not failed:
                yield sse(shape.usage_chunk(*head, stream.request.prompt_len, stream.num_output_tokens))
            yield DONE
        finally:
            self.hub.release(stream)

    def _stopped(self, stream: RequestStream) -> None:
        if not stream.ended:  # the engine still runs it: the abort its release sends counts as a stop
            self.metrics.stopped_by_string(stream.id)

    async def complete(self, shape: Shape, stream: RequestStream, body: SamplingBody) -> dict:
        """The whole answer at once; raises the stream's APIError if the request failed."""
        text = OutputText(self.model.codec, body.stop)
        pieces: list[str] = []
        token_ids: list[int] = []
        finish = "abort"
        try:
            async for event in stream.events():
                if event.error is not None:
                    raise event.error
                token_ids += event.token_ids
                pieces.append(text.feed(event.token_ids))
                if text.stopped:
                    finish = "stop"
                    self._stopped(stream)
                    break
                if event.finish_reason is not None:
                    finish = event.finish_reason
                    pieces.append(text.flush())
        finally:
            self.hub.release(stream)
        return shape.response(stream.id, stream.created, self.model.name, "".join(pieces), token_ids, finish,
                              stream.request.prompt_len)


async def unless_disconnected(answer: Awaitable[dict], raw: HTTPRequest) -> dict | None:
    """Await the answer, or give up (cancelling it, which releases its request) when the client leaves."""
    task = asyncio.ensure_future(answer)
    watch = asyncio.ensure_future(_disconnect(raw))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()  # its finally releases the request
    with contextlib.suppress(asyncio.CancelledError):
        return await task
    return None


async def _disconnect(raw: HTTPRequest) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass
