"""A request's JSON body, parsed and validated on a thread of the server's, never on the event loop: a
4 MiB body of 100,000 chat messages takes pydantic most of a second, which would stall /health and
every stream for as long. What cannot be read is a 400 saying why, in OpenAI's error object."""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from batchtop.core_engine.serve.protocol import APIError, validation_error

Body = TypeVar("Body", bound=BaseModel)


def body_problem(cause: BaseException | None) -> str:
    """Why a body is not JSON that can be read."""
    if isinstance(cause, json.JSONDecodeError):
        return f"the body is not valid JSON: {cause.msg}"
    if isinstance(cause, UnicodeDecodeError):
        return (f"the body is not valid JSON: it is not UTF-8 text (byte 0x{cause.object[cause.start]:02x} "
                f"at offset {cause.start})")
    if isinstance(cause, RecursionError):
        return "the body is not valid JSON that can be read: it is nested too deeply"
    if isinstance(cause, ValueError):  # an integer of more digits than Python converts, ...
        return f"the body is not valid JSON that can be read: {cause}"
    return "the body could not be read" + (f": {type(cause).__name__}: {cause}" if cause is not None else "")


def parse_body(data: bytes, model: type[Body]) -> Body:
    """The body as `model`; APIError 400 naming what is wrong (the field, for a value pydantic refuses)."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise APIError(400, body_problem(exc)) from None
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise validation_error(list(exc.errors())) from None
