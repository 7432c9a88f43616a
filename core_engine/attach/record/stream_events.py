"""The side streams in an attach recording: each step line the server logged ("log_line", the line as
it was) and each KV-event message ("kv", its frames in base64), under the tick whose drain took them and
at the time they arrived, so a replay feeds the monitor exactly what the live watch fed it."""

from __future__ import annotations

import base64
import binascii

from batchtop.core_engine.attach.streams.log_follower import MAX_LINE_BYTES
from batchtop.core_engine.attach.streams.stream_tick import KVMessage
from batchtop.core_engine.trace.checks import integer, list_of, number, text

LOG_LINE, KV = "log_line", "kv"
TYPES = (LOG_LINE, KV)
MAX_FRAMES = 16  # a KV message has three


def log_line_event(tick: int, line: str) -> dict:
    return {"type": LOG_LINE, "tick": tick, "line": line}


def kv_event(tick: int, message: KVMessage) -> dict:
    event = {"type": KV, "tick": tick, "frames": [base64.b64encode(f).decode("ascii") for f in message.frames]}
    return event | ({"replayed": True} if message.replayed else {})


def _frames(v: object) -> str | None:
    problem = list_of(text)(v)
    if problem is not None:
        return problem
    if len(v) > MAX_FRAMES:  # type: ignore[arg-type]
        return f"holds {len(v)} frames, more than any message has"  # type: ignore[arg-type]
    for i, frame in enumerate(v):  # type: ignore[arg-type]
        try:
            base64.b64decode(frame, validate=True)
        except (binascii.Error, ValueError):
            return f"[{i}] is not base64"
    return None


def stream_problem(event: dict) -> str | None:
    """None when a log_line or kv event can be replayed; else its field and what is wrong with it."""
    checks = {"tick": integer(0), "t": number(0.0)}
    checks |= {"line": text} if event["type"] == LOG_LINE else {"frames": _frames}
    for name, check in checks.items():
        if name not in event:
            return f"field {name} is missing"
        problem = check(event[name])
        if problem is not None:
            return f"field {name} {problem}"
    if event["type"] == LOG_LINE and len(event["line"]) > MAX_LINE_BYTES:
        return f"field line is {len(event['line'])} characters, longer than a logged step line can be"
    if "replayed" in event and not isinstance(event["replayed"], bool):
        return f"field replayed must be true or false, got {event['replayed']!r}"
    return None


def log_line(event: dict) -> tuple[float, str]:
    return float(event["t"]), event["line"]


def kv_message(event: dict) -> KVMessage:
    return KVMessage(float(event["t"]), tuple(base64.b64decode(f) for f in event["frames"]),
                     bool(event.get("replayed", False)))
