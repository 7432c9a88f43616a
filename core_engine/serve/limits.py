"""Guards in front of every route, before any body is read: the API key, then the body's size and the
time it takes to arrive."""

from __future__ import annotations

import asyncio
import json
import secrets

from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.serve.protocol import APIError

MAX_BODY_BYTES = 4 << 20
BODY_TIMEOUT_S = 30.0  # from the request's headers to its body's last byte
OPEN_PATHS = ("/health", "/metrics")  # what a load balancer and a scraper reach without the key


def check_api_key(key: str | None, option: str = "--api-key") -> str | None:
    """None (no auth), or a key a client can send: an empty or blank one would turn auth off or lock
    every client out, so it is refused, as is anything an HTTP header cannot carry as it is."""
    if key is None:
        return None
    if not key or not all("\x21" <= c <= "\x7e" for c in key):
        what = "empty" if not key else "not printable ASCII without spaces"
        raise ConfigError(option, f"the API key is {what}; give a key clients send as `Authorization: Bearer "
                                  f"KEY`, or leave the option out to serve without one")
    return key


class RequestGuards:
    """ASGI middleware: 401 without the API key (when one is set) on every path but /health and /metrics;
    413 for a body over the limit, whether it declares its length up front or arrives chunked; 408 and
    the connection closed for a body that has not all arrived within body_timeout_s."""

    def __init__(self, app, api_key: str | None = None, max_bytes: int = MAX_BODY_BYTES,
                 body_timeout_s: float = BODY_TIMEOUT_S) -> None:
        self.app = app
        self.api_key = check_api_key(api_key)
        self.max_bytes = max_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        if self.api_key is not None and scope["path"] not in OPEN_PATHS:
            authorization = headers.get(b"authorization", b"").decode("latin-1")
            if not key_matches(self.api_key, authorization):
                await _send_error(send, APIError(401, "a valid API key is needed: send `Authorization: Bearer <key>`"))
                return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _send_error(send, self._too_large())
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout_s
        received = 0
        body_done = False
        refusal: APIError | None = None
        started = False

        async def guarded_receive():
            nonlocal received, body_done, refusal
            if body_done:  # after the body: the wait for a disconnect, which has no deadline
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                refusal = APIError(408, f"the request body did not arrive within {self.body_timeout_s:g} s",
                                   headers={"Connection": "close"})
                raise _Refused from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > self.max_bytes:
                    refusal = self._too_large()
                    raise _Refused
            return message

        async def guarded_send(message) -> None:
            nonlocal started
            if refusal is not None:  # whatever the app makes of the interrupted body, the client gets ours
                return
            started = True
            await send(message)

        try:
            await self.app(scope, guarded_receive, guarded_send)
        except _Refused:
            pass
        if refusal is not None and not started:
            await _send_error(send, refusal)

    def _too_large(self) -> APIError:
        return APIError(413, f"the request body is over {self.max_bytes >> 20} MiB")


class _Refused(Exception):
    pass


async def _send_error(send, error: APIError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def key_matches(expected: str, authorization: str) -> bool:
    """`Authorization: Bearer <expected>`, compared in constant time."""
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), expected.encode())
