"""Guards in front of every route, before any body is read: the API key on /v1, then the body size."""

from __future__ import annotations

import json
import secrets

from batchtop.core_engine.serve.protocol import APIError

MAX_BODY_BYTES = 4 << 20


class RequestGuards:
    """ASGI middleware: 401 on /v1 without the API key (when one is set); 413 for a body over the limit,
    whether it declares its length up front or arrives chunked. /health and /metrics stay open."""

    def __init__(self, app, api_key: str | None = None, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.api_key = api_key
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        if self.api_key is not None and scope["path"].startswith("/v1"):
            authorization = headers.get(b"authorization", b"").decode("latin-1")
            if not key_matches(self.api_key, authorization):
                await _send_error(send, APIError(401, "a valid API key is needed: send `Authorization: Bearer <key>`"))
                return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        received = 0
        refused = started = False

        async def counted_receive():
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    refused = True
                    raise _TooLarge
            return message

        async def guarded_send(message) -> None:
            nonlocal started
            if refused:  # whatever the app makes of the interrupted body, the client gets the 413
                return
            started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except _TooLarge:
            pass
        if refused and not started:
            await self._refuse(send)

    async def _refuse(self, send) -> None:
        await _send_error(send, APIError(413, f"the request body is over {self.max_bytes >> 20} MiB"))


class _TooLarge(Exception):
    pass


async def _send_error(send, error: APIError) -> None:
    body = json.dumps(error.body()).encode()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def key_matches(expected: str, authorization: str) -> bool:
    """`Authorization: Bearer <expected>`, compared in constant time."""
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), expected.encode())
