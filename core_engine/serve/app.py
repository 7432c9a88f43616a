"""The FastAPI application: OpenAI's /v1 routes, /health and /metrics, over one RequestHub.

FastAPI + uvicorn is what vLLM's own server runs on, so its behaviour (SSE framing, disconnects,
graceful shutdown) is what clients of vLLM already meet; pydantic gives field-named 400s for free.
Bodies are parsed and validated on threads (bodies.py), not by FastAPI on the event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from batchtop.core_engine.serve.bodies import Body, parse_body
from batchtop.core_engine.serve.error_responses import error_response, http_error, internal_error
from batchtop.core_engine.serve.exporter import VllmMetrics
from batchtop.core_engine.serve.hub import RequestHub
from batchtop.core_engine.serve.limits import BODY_TIMEOUT_S, MAX_BODY_BYTES, RequestGuards
from batchtop.core_engine.serve.prompt_text import PromptText
from batchtop.core_engine.serve.prompts import ServedModel, chat_prompt, completion_prompt, engine_request
from batchtop.core_engine.serve.protocol import APIError, ChatBody, CompletionBody, SamplingBody
from batchtop.core_engine.serve.responses import CHAT, COMPLETION, Shape
from batchtop.core_engine.serve.step_route import add_step_route
from batchtop.core_engine.serve.step_stream import StepPublisher
from batchtop.core_engine.serve.streaming import CLIENT_CLOSED_REQUEST, Responder, unless_disconnected


def create_app(model: ServedModel, hub: RequestHub, metrics: VllmMetrics, *, api_key: str | None = None,
               max_body_bytes: int = MAX_BODY_BYTES, body_timeout_s: float = BODY_TIMEOUT_S,
               steps: StepPublisher | None = None) -> FastAPI:
    """steps: the engine's step stream, published at /batchtop/steps (step_route.py) when given."""
    responder = Responder(hub, model, metrics)
    text = None if model.codec is None else PromptText(model.codec, model.config, model.chat)
    parser = ThreadPoolExecutor(2, thread_name_prefix="batchtop-parse")
    started = int(time.time())
    numbers = itertools.count(1)  # short ids: the panels show them (unique for the server's life)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        hub.bind(asyncio.get_running_loop())
        if steps is not None:
            steps.bind(asyncio.get_running_loop())
        yield
        parser.shutdown(wait=False, cancel_futures=True)
        if text is not None:
            text.close()

    app = FastAPI(title="batchtop", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(RequestGuards, api_key=api_key, max_bytes=max_body_bytes, body_timeout_s=body_timeout_s)

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> Response:
        return error_response(exc)

    @app.exception_handler(HTTPException)  # no such route, a method the route does not answer
    async def starlette_error(raw: Request, exc: HTTPException) -> Response:
        return error_response(http_error(raw.method, raw.url.path, exc))

    @app.exception_handler(Exception)  # a bug: still OpenAI's error object, never a plain-text page
    async def crashed(_: Request, exc: Exception) -> Response:
        return error_response(internal_error(exc))

    async def read(raw: Request, kind: type[Body]) -> Body:
        data = await raw.body()
        return await asyncio.get_running_loop().run_in_executor(parser, parse_body, data, kind)

    async def answer(shape: Shape, body: SamplingBody, prompt: Callable[[], Awaitable[tuple[int, ...]]],
                     max_tokens: int | None, raw: Request) -> Response:
        body.check_supported()
        model.check_name(body.model)
        request = engine_request(f"{shape.id_prefix}-{next(numbers)}", await prompt(), body, max_tokens, model)
        stream = hub.submit(request)
        if body.stream:
            return StreamingResponse(responder.stream(shape, stream, body), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        result = await unless_disconnected(responder.complete(shape, stream, body), raw)
        return Response(status_code=CLIENT_CLOSED_REQUEST) if result is None else JSONResponse(result)

    @app.post("/v1/completions")
    async def completions(raw: Request) -> Response:
        body = await read(raw, CompletionBody)
        return await answer(COMPLETION, body, lambda: completion_prompt(body, model, text), body.max_tokens, raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request) -> Response:
        body = await read(raw, ChatBody)
        return await answer(CHAT, body, lambda: chat_prompt(body, text), body.requested_max_tokens, raw)

    @app.api_route("/v1/models", methods=["GET", "HEAD"])
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": model.name, "object": "model", "created": started, "owned_by": "batchtop", "root": model.name,
            "parent": None, "max_model_len": model.config.max_model_len}]}

    @app.api_route("/health", methods=["GET", "HEAD"])  # HEAD: what a load balancer's probe may send
    async def health() -> Response:
        problem = hub.health()
        if problem is None:
            return Response(status_code=200)
        return error_response(APIError(503, problem))

    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def metrics_text() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    if steps is not None:
        add_step_route(app, steps, hub)
    return app
