"""What each line of an attach recording must hold, checked before a replay uses it, so a damaged or
hand-edited recording fails naming its line and field (exit 2) instead of a TypeError deep in a replay.

Types only: a sample that is well-formed but impossible (a negative gauge, KV above 1) is the
replica's problem, not the file's; the replay's window marks that replica BAD as the live session did.
"""

from __future__ import annotations

import math

from batchtop.core_engine.attach.record.stream_events import stream_problem
from batchtop.core_engine.attach.scrape.scrape import BAD, DOWN, LIVE, STALE
from batchtop.core_engine.attach.servers import flavour_names
from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.trace.trace import Trace, TraceError
from batchtop.core_engine.trace.schema import Check, integer, list_of, number, one_of, optional, text

DTYPES = ("bfloat16", "float16", "float32")
MODEL_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads")


def _flavour(v: object) -> str | None:
    return one_of(flavour_names())(v)  # the registry as it is now: a family added is a flavour recorded


def _is_num(v: object) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer past any float
        return False


def real(v: object) -> str | None:
    """Any finite number, of either sign (whether a gauge may be negative is the window's question)."""
    return None if _is_num(v) else f"must be a number, got {v!r}"


def whole(v: object) -> str | None:
    ok = isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**53  # exact as a float too
    return None if ok else f"must be an integer, got {v!r}"


def size(v: object) -> str | None:
    ok = isinstance(v, int) and not isinstance(v, bool) and 1 <= v < 2**40
    return None if ok else f"must be an integer in 1..2^40, got {v!r}"


def positive(v: object) -> str | None:
    return None if _is_num(v) and v > 0 else f"must be a number > 0, got {v!r}"  # type: ignore[operator]


def _join(name: str, problem: str) -> str:
    """A field's name and its problem; a problem inside it (".sub ..." or "[i] ...") extends the name."""
    return f"{name}{problem}" if problem.startswith((".", "[")) else f"{name} {problem}"


def _fields(v: object, fields: dict[str, Check], required: tuple[str, ...] = ()) -> str | None:
    """An object whose listed fields pass their checks: ".name problem" for the first that does not."""
    if not isinstance(v, dict):
        return f"must be an object, got {v!r}"
    for name, check in fields.items():
        if name not in v:
            if name in required:
                return f".{name} is missing"
            continue
        problem = check(v[name])
        if problem is not None:
            return "." + _join(name, problem)
    return None


def mapping_of(check: Check) -> Check:
    def check_mapping(v: object) -> str | None:
        if not isinstance(v, dict):
            return f"must be an object, got {v!r}"
        for key, item in v.items():
            problem = check(item)
            if problem is not None:
                return "." + _join(str(key), problem)
        return None
    return check_mapping


def _bound(v: object) -> str | None:
    return None if v == "+Inf" or _is_num(v) else f"must be a number or \"+Inf\", got {v!r}"


def _histogram(v: object) -> str | None:
    problem = _fields(v, {"le": list_of(_bound), "counts": list_of(real), "sum": real, "count": real},
                      ("le", "counts", "sum", "count"))
    if problem is None and len(v["le"]) != len(v["counts"]):  # type: ignore[index]
        return f".counts has {len(v['counts'])} entries for {len(v['le'])} bounds"  # type: ignore[index]
    return problem


def _flag(v: object) -> str | None:
    return None if isinstance(v, bool) else f"must be true or false, got {v!r}"


def _slot(v: object) -> str | None:
    return _fields(v, {"id": whole, "processing": _flag, "n_ctx": optional(whole), "n_decoded": optional(whole)},
                   ("id", "processing")) or _no_other_fields(v, ("id", "processing", "n_ctx", "n_decoded"))


def _no_other_fields(v: object, known: tuple[str, ...]) -> str | None:
    extra = sorted(set(v) - set(known)) if isinstance(v, dict) else []
    return f".{extra[0]} is not a field of a slot" if extra else None


def _slots(v: object) -> str | None:
    if not isinstance(v, list):
        return f"must be a list, got {v!r}"
    for i, item in enumerate(v):
        problem = _slot(item)
        if problem is not None:
            return f"[{i}]" + (problem if problem.startswith(".") else f" {problem}")
    return None


SAMPLE_FIELDS: dict[str, Check] = {
    "t": number(0.0), "flavour": _flavour, "model_name": optional(text),
    "running": optional(real), "waiting": optional(real), "waiting_by_reason": optional(mapping_of(real)),
    "kv_usage": optional(real), "counters": optional(mapping_of(real)), "success": optional(mapping_of(real)),
    "histograms": optional(mapping_of(_histogram)), "num_gpu_blocks": optional(whole),
    "block_size": optional(whole), "kv_capacity_tokens": optional(real), "max_num_seqs": optional(whole),
    "mode": optional(text), "start_time": optional(real), "ceiling_from": optional(text),
    "token_budget": optional(whole), "slots": optional(_slots), "note": optional(text),
}


def _sample(v: object) -> str | None:
    return _fields(v, SAMPLE_FIELDS, ("t", "flavour"))


def scrape_problem(event: dict, num_replicas: int) -> str | None:
    """None when a scrape event can be replayed; else its field and what is wrong with it."""
    checks: dict[str, Check] = {
        "tick": integer(0), "replica": integer(0), "status": one_of((LIVE, DOWN, STALE, BAD)),
        "reason": optional(text), "latency_s": number(0.0), "sample": optional(_sample),
    }
    for name, check in checks.items():
        if name not in event:
            if name in ("tick", "replica", "status"):
                return f"field {name} is missing"
            continue
        problem = check(event[name])
        if problem is not None:
            return f"field {_join(name, problem)}"
    if event["status"] == LIVE and event.get("sample") is None:
        return "field sample is missing: a LIVE scrape has one"
    if event["replica"] >= num_replicas:
        return f"field replica {event['replica']} is not one of the header's {num_replicas} urls"
    return None


def _estimate(v: object) -> str | None:
    problem = _fields(v, {"model": lambda m: _fields(m, {k: size for k in MODEL_SIZES}, MODEL_SIZES),
                          "dtype": one_of(DTYPES)}, ("model", "dtype"))
    if problem is not None:
        return problem
    try:
        ModelConfig.from_dict(v["model"])  # type: ignore[index]
    except (BadInput, KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError) as exc:
        return f".model is not a model's dims ({exc})"
    return None


def _peaks(v: object) -> str | None:
    return _fields(v, {"device_name": text, "source": text, "peak_flops": positive, "peak_bytes_per_s": positive},
                   ("device_name", "source", "peak_flops", "peak_bytes_per_s"))


def _urls(v: object) -> str | None:
    return list_of(text)(v) or (None if v else "must list at least one URL, got []")


def _streams(v: object) -> str | None:
    return _fields(v, {"log": optional(text), "kv_events": optional(text), "model_params": optional(positive),
                       "tokenizer": optional(text)})


HEADER_FIELDS: dict[str, Check] = {
    "urls": _urls, "interval_s": optional(positive), "window_s": optional(positive),
    "max_num_seqs": optional(size), "estimate": optional(_estimate), "peaks": optional(_peaks),
    "peaks_note": optional(text), "streams": optional(_streams),
}


def header_problem(header: dict) -> str | None:
    if not isinstance(header, dict):
        return "header: must be an object"
    problem = _fields(header, HEADER_FIELDS, ("urls",))
    return None if problem is None else f"header: field {problem[1:]}"


def check_attach_header(trace: Trace) -> None:
    """TraceError naming the field when the header cannot set up a replay."""
    problem = header_problem(trace.header)
    if problem is not None:
        raise TraceError(f"{trace.path}:1: {problem}")


def _where(trace: Trace, index: int) -> str:
    event = trace.events[index]
    return f"{trace.path}:{trace.lines[index]}" if index < len(trace.lines) else f"{trace.path}: seq {event.get('seq')}"


def check_scrape(trace: Trace, index: int, num_replicas: int) -> None:
    """TraceError naming the line and field when trace.events[index] cannot be replayed."""
    problem = scrape_problem(trace.events[index], num_replicas)
    if problem is not None:
        raise TraceError(f"{_where(trace, index)}: scrape event: {problem}")


def check_stream_event(trace: Trace, index: int) -> None:
    """The same for a side stream's event (a logged step line, a KV-event message)."""
    event = trace.events[index]
    problem = stream_problem(event)
    if problem is not None:
        raise TraceError(f"{_where(trace, index)}: {event['type']} event: {problem}")
