"""Every error the server answers, in OpenAI's shape, whoever raised it: our APIError, Starlette's
HTTPException (no such route, a method the route does not take) and any bug. Rendered as ASCII JSON, so an error that quotes a client's lone surrogate still renders.
"""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.responses import Response

from batchtop.core_engine.serve.bodies import body_problem
from batchtop.core_engine.serve.protocol import APIError

METHOD_ORDER = {"GET": 0, "HEAD": 1, "POST": 2}


def error_response(error: APIError) -> Response:
    body = json.dumps(error.body(), separators=(",", ":"))  # ensure_ascii: escapes what is not text
    return Response(body, error.status, headers=error.headers, media_type="application/json")


def http_error(method: str, path: str, exc: HTTPException) -> APIError:
    headers = dict(exc.headers or {})
    if exc.status_code == 404:
        return APIError(404, f"there is no route {path}", headers=headers)
    if exc.status_code == 405:  # Starlette lists a route's methods from a set: in a fixed order here
        methods = [m.strip() for m in headers.get("Allow", "").split(",") if m.strip()]
        allowed = headers["Allow"] = ", ".join(sorted(methods, key=lambda m: (METHOD_ORDER.get(m, 99), m)))
        return APIError(405, f"{method} is not allowed on {path}; it answers {allowed}", headers=headers)
    if exc.status_code == 400:
        return APIError(400, body_problem(exc.__cause__), headers=headers)
    return APIError(exc.status_code, str(exc.detail), headers=headers)


def internal_error(exc: Exception) -> APIError:
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}")
