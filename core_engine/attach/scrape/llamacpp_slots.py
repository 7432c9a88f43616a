"""llama.cpp's /slots (tools/server/README.md, "GET /slots"): one object per slot, with `id`,
`is_processing`, `n_ctx` and `next_token.n_decoded`. Its length is the slot ceiling (--parallel),
which /metrics does not say; it is on by default and off with --no-slots."""

from __future__ import annotations

import json
import math

from batchtop.core_engine.attach.scrape.sample import Slot

DISABLED_NOTE = "/slots is off on this server (--no-slots): the slot ceiling is unknown"


def slots_url(metrics_path: str) -> str:
    """/slots beside the /metrics path the user gave (…/metrics -> …/slots)."""
    base = metrics_path.split("?", 1)[0]
    return (base[:-len("/metrics")] if base.endswith("/metrics") else base.rstrip("/")) + "/slots"


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return int(value)


def parse_slots(body: bytes) -> tuple[tuple[Slot, ...] | None, str | None]:
    """(the slots, None), or (None, why they cannot be read): a bad /slots costs its panel, not the scrape."""
    try:
        data = json.loads(body.decode("utf-8", errors="replace"))
    except ValueError:
        return None, "/slots answered something that is not JSON"
    if not isinstance(data, list) or not data or not all(isinstance(s, dict) for s in data):
        return None, "/slots answered no list of slots"
    out = []
    for i, s in enumerate(data):
        sid = _count(s.get("id", i))
        if sid is None or not isinstance(s.get("is_processing"), bool):
            return None, f"/slots entry {i} has no id or is_processing"
        token = s.get("next_token")
        decoded = _count(token.get("n_decoded")) if isinstance(token, dict) else None
        out.append(Slot(sid, s["is_processing"], _count(s.get("n_ctx")), decoded))
    return tuple(out), None
