"""The FastAPI application: OpenAI's /v1 routes, /health and /metrics, over one RequestHub.

FastAPI + uvicorn is what vLLM's own server runs on, so its behaviour (SSE framing, disconnects,
graceful shutdown) is what clients of vLLM already meet; pydantic gives field-named 400s for free.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from batchtop.core_engine.serve.exporter import VllmMetrics
from batchtop.core_engine.serve.hub import RequestHub
from batchtop.core_engine.serve.limits import MAX_BODY_BYTES, RequestGuards
from batchtop.core_engine.serve.prompts import ServedModel, chat_prompt, completion_prompt, engine_request
from batchtop.core_engine.serve.protocol import APIError, ChatBody, CompletionBody, SamplingBody, validation_error
from batchtop.core_engine.serve.responses import CHAT, COMPLETION, Shape
from batchtop.core_engine.serve.streaming import CLIENT_CLOSED_REQUEST, Responder, unless_disconnected


def create_app(model: ServedModel, hub: RequestHub, metrics: VllmMetrics, *, api_key: str | None = None,
               max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    responder = Responder(hub, model, metrics)
    started = int(time.time())
    numbers = itertools.count(1)  # short ids: the panels show them (unique for the server's life)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        hub.bind(asyncio.get_running_loop())
        yield

    app = FastAPI(title="batchtop", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(RequestGuards, api_key=api_key, max_bytes=max_body_bytes)

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def bad_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        error = validation_error(list(exc.errors()))
        return JSONResponse(error.body(), error.status)

    async def answer(shape: Shape, body: SamplingBody, prompt: Callable[[], tuple[int, ...]],
                     max_tokens: int | None, raw: Request) -> Response:
        body.check_supported()
        model.check_name(body.model)
        request = engine_request(f"{shape.id_prefix}-{next(numbers)}", prompt(), body, max_tokens, model)
        stream = hub.submit(request)
        if body.stream:
            return StreamingResponse(responder.stream(shape, stream, body), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        result = await unless_disconnected(responder.complete(shape, stream, body), raw)
        return Response(status_code=CLIENT_CLOSED_REQUEST) if result is None else JSONResponse(result)

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, raw: Request) -> Response:
        return await answer(COMPLETION, body, lambda: completion_prompt(body, model), body.max_tokens, raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, raw: Request) -> Response:
        return await answer(CHAT, body, lambda: chat_prompt(body, model), body.requested_max_tokens, raw)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": model.name, "object": "model", "created": started, "owned_by": "batchtop", "root": model.name,
            "parent": None, "max_model_len": model.config.max_model_len}]}

    @app.get("/health")
    async def health() -> Response:
        problem = hub.health()
        if problem is None:
            return Response(status_code=200)
        return JSONResponse(APIError(503, problem).body(), 503)

    @app.get("/metrics")
    async def metrics_text() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return app
