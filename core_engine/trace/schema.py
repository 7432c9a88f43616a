"""What each line of a batchtop.trace must hold, checked as it is read, so a damaged or hand-edited
trace fails with its line and field named instead of a KeyError deep in a replay.

Checks are per trace source (the header's "source"; an engine session has none, or "engine"): another
source registers its own event schemas in SOURCES. A source with no entry gets the framing checks
only (seq, t, type), and its events are passed through for its own reader.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from batchtop.core_engine.config import MODES, EngineConfig, config_from_dict
from batchtop.core_engine.engine.snapshot import Counters, FinishedRequest
from batchtop.core_engine.model.cost import StepCost
from batchtop.core_engine.sched.wait_reason import WaitKind
from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.perf.device_peaks import DevicePeaks

ENGINE_SOURCE = "engine"
Check = Callable[[object], str | None]  # None when the value is good, else what is wrong with it
# What a number in a trace may be: finite is not enough, a replay sums times and costs over every step
# and a fit squares them. Far past any real session (31,700 years; 1e30 FLOPs or bytes in one step;
# counts a float holds exactly), so only a damaged or hand-edited line meets them.
MAX_SECONDS = 1e12
MAX_WORK = 1e30
MAX_COUNT = 2 ** 53
MAX_LENGTH = 2 ** 63 - 1
PEAK_RANGES = {"peak_flops": (1e3, 1e21), "peak_bytes_per_s": (1e3, 1e18)}  # from a microcontroller to a rack


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def integer(minimum: int = 0, maximum: int = MAX_COUNT) -> Check:
    def check(v: object) -> str | None:
        if _is_int(v) and minimum <= v <= maximum:
            return None
        shown = f"an integer of {len(str(v))} digits" if _is_int(v) and v > 10 ** 30 else repr(v)
        return f"must be an integer >= {minimum} and at most {maximum}, got {shown}"
    return check


def number(minimum: float = 0.0, maximum: float = MAX_SECONDS) -> Check:
    return lambda v: (None if _is_num(v) and minimum <= v <= maximum
                      else f"must be a number >= {minimum:g} and at most {maximum:g}, got {v!r}")


def text(v: object) -> str | None:
    return None if isinstance(v, str) else f"must be a string, got {v!r}"


def one_of(choices: tuple[str, ...]) -> Check:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}, got {v!r}"


def optional(check: Check) -> Check:
    return lambda v: None if v is None else check(v)


def anything(v: object) -> str | None:
    return None


def list_of(check: Check, *, lengths: tuple[int, ...] | None = None, even: bool = False) -> Check:
    def check_list(v: object) -> str | None:
        if not isinstance(v, list):
            return f"must be a list, got {v!r}"
        if lengths is not None and len(v) not in lengths:
            return f"must have {' or '.join(map(str, lengths))} entries, has {len(v)}"
        if even and len(v) % 2:
            return f"must have an even number of entries (pairs), has {len(v)}"
        for i, item in enumerate(v):
            problem = check(item)
            if problem is not None:
                return f"[{i}] {problem}"
        return None
    return check_list


def _slot(v: object) -> str | None:
    """0 for an empty slot, else [request index, phase code, computed, generated(, prompt padding(, cached))]."""
    if v == 0 and _is_int(v):
        return None
    if not isinstance(v, list) or len(v) not in (4, 5, 6):
        return f"must be 0 or [index, phase, computed, generated(, padding(, cached))], got {v!r}"
    if v[1] not in ("p", "d", "x", "i", "f"):
        return f"phase must be one of p, d, x, i, f, got {v[1]!r}"
    if not all(_is_int(x) and x >= 0 for i, x in enumerate(v) if i != 1):
        return f"must hold integers >= 0 beside its phase, got {v!r}"
    return None


def _wait(v: object) -> str | None:
    kinds = tuple(k.value for k in WaitKind)
    if not isinstance(v, list) or len(v) != 3 or v[0] not in kinds or not all(isinstance(x, str) for x in v):
        return f"must be [kind ({', '.join(kinds)}), message, short], got {v!r}"
    return None


def _runs(v: object) -> str | None:
    """A block map, run-length encoded: value, count, value, count... The owners ("kv"): a request index,
    -1 for free; the holders ("kv_refs"): their number, 0 for free, -1 for free but cached."""
    problem = list_of(integer(-1), even=True)(v)
    if problem is not None:
        return problem
    bad = next((i for i in range(1, len(v), 2) if v[i] < 1), None)  # type: ignore[arg-type]
    return None if bad is None else f"[{bad}] is a run of {v[bad]} blocks; runs have >= 1"  # type: ignore[index]


_COUNT = integer(0)
# a trace from before prefix caching has the counters without its last three (queries, hits, cached)
COUNTER_LENGTHS = (len(Counters.__slots__) - 3, len(Counters.__slots__))
_TIME = number(0.0)
_WORK = number(0.0, MAX_WORK)
STEP_FIELDS: dict[str, Check] = {
    "step": _COUNT, "run_t": _TIME, "mode": one_of(MODES), "max_num_seqs": integer(1),
    "max_num_batched_tokens": integer(1), "times": list_of(_TIME, lengths=(4,)),
    "tokens": list_of(_COUNT, lengths=(4, 5)), "slots": list_of(_slot), "free_blocks": _COUNT,
    "waiting": list_of(_COUNT, even=True), "num_waiting": _COUNT, "pending": _COUNT,
    "admitted": list_of(text), "preempted": list_of(text),
    "counters": list_of(_COUNT, lengths=COUNTER_LENGTHS),
    "cost": list_of(_WORK, lengths=(len(StepCost.__slots__),)),
}
OPTIONAL_STEP_FIELDS: dict[str, Check] = {"wait": optional(_wait), "kv": _runs, "kv_refs": _runs, "pace": _TIME,
                                          "decode_cost": list_of(_WORK, lengths=(len(StepCost.__slots__),))}
FINISH_TYPES: dict[str, Check] = {
    "request_id": text, "index": _COUNT, "prompt_len": _COUNT, "num_generated": _COUNT, "arrival_s": _TIME,
    "first_token_s": optional(_TIME), "finish_s": _TIME, "num_preemptions": _COUNT, "finish_reason": text,
}
assert set(FINISH_TYPES) | {"output_token_ids"} == set(FinishedRequest.__slots__)
def _text_pair(v: object) -> str | None:
    ok = isinstance(v, list) and len(v) == 2 and _is_int(v[0]) and v[0] >= 0 and isinstance(v[1], str)
    return None if ok else f"must be [request index, text], got {v!r}"


_PAIRS = list_of(_text_pair)

# event type -> (required fields, optional fields)
ENGINE_EVENTS: dict[str, tuple[dict[str, Check], dict[str, Check]]] = {
    "control": ({"name": text}, {"value": anything}),
    # a request refused for its size arrives too: lengths up to what a workload may give (2**63-1)
    "arrival": ({"index": _COUNT, "id": text, "prompt_len": integer(1, MAX_LENGTH), "max_tokens": integer(1, MAX_LENGTH),
                 "arrival_s": _TIME}, {}),
    "reject": ({"id": text, "reason": text}, {}),
    "finish": (FINISH_TYPES, {"output_token_ids": list_of(_COUNT)}),
    "text": ({"prompts": _PAIRS, "outputs": _PAIRS}, {}),
    "step": (STEP_FIELDS, OPTIONAL_STEP_FIELDS),
    "view": (STEP_FIELDS, OPTIONAL_STEP_FIELDS),
    "error": ({"message": text}, {}),
    "end": ({"reason": text}, {}),
}
SOURCES: dict[str, dict[str, tuple[dict[str, Check], dict[str, Check]]]] = {ENGINE_SOURCE: ENGINE_EVENTS}
# the control values a replay shows or acts on (the others are only listed)
CONTROL_VALUES: dict[str, Check] = {"caption": optional(text), "mode": one_of(MODES), "max_num_seqs": integer(1)}


def framing_problem(event: dict) -> str | None:
    """What every line of any trace needs: an integer seq, a finite time, a type."""
    for name, check in (("seq", integer(0)), ("t", number(0.0)), ("type", text)):
        if name not in event:
            return f"field {name} is missing"
        problem = check(event[name])
        if problem is not None:
            return f"field {name} {problem}"
    return None


def event_problem(event: dict, schemas: dict[str, tuple[dict[str, Check], dict[str, Check]]]) -> str | None:
    """None when the event matches its type's schema (or its type has none); else field and problem."""
    if event["type"] == "control" and event.get("name") in CONTROL_VALUES:
        problem = CONTROL_VALUES[event["name"]](event.get("value"))
        if problem is not None:
            return f"control event {event['name']}: field value {problem}"
    required, optional_fields = schemas[event["type"]]
    for name, check in required.items():
        if name not in event:
            return f"{event['type']} event: field {name} is missing"
        problem = check(event[name])
        if problem is not None:
            return f"{event['type']} event: field {name} {problem}"
    for name, check in optional_fields.items():
        if name in event:
            problem = check(event[name])
            if problem is not None:
                return f"{event['type']} event: field {name} {problem}"
    return None


def header_problem(header: dict) -> str | None:
    """The types of an engine-session header's fields (engine_header: the ones a replay needs)."""
    if "config" in header and not isinstance(header["config"], dict):
        return f"header: field config must be an object, got {header['config']!r}"
    for name in ("device", "workload", "simulated"):
        if header.get(name) is not None and not isinstance(header[name], dict):
            return f"header: field {name} must be an object, got {header[name]!r}"
    if "text" in header and not isinstance(header["text"], bool):
        return f"header: field text must be true or false, got {header['text']!r}"
    return _peaks_problem(header.get("peaks"))


def _peaks_problem(peaks: object) -> str | None:
    if peaks is None:
        return None
    if not isinstance(peaks, dict):
        return f"header: field peaks must be an object or null, got {peaks!r}"
    for name, check in (("device_name", text), ("source", text)):
        if name not in peaks or check(peaks[name]) is not None:
            return f"header: field peaks.{name} must be a string, got {peaks.get(name)!r}"
    for name, (low, high) in PEAK_RANGES.items():
        value = peaks.get(name)
        if not _is_num(value) or value <= 0:
            return f"header: field peaks.{name} must be a number > 0, got {value!r}"
        if not low <= value <= high:
            return f"header: field peaks.{name} must be in {low:g}..{high:g} per second, got {value!r}"
    return None


class HeaderError(BadInput):
    """A header a replay cannot use (raised as TraceError by the reader's callers)."""


def engine_header(header: dict) -> tuple[EngineConfig, DevicePeaks | None]:
    """The recorded engine's config and device peaks, for a replay or a calibration; HeaderError
    naming the field when the header cannot give them."""
    if "config" not in header:
        raise HeaderError("header: field config is missing (the recorded engine's settings)")
    if "peaks" not in header:
        raise HeaderError("header: field peaks is missing (null when the device had none)")
    try:
        config = config_from_dict(header["config"])
    except BadInput as exc:
        raise HeaderError(f"header: field config: {exc}") from None
    except KeyError as exc:
        raise HeaderError(f"header: field config.{exc.args[0]} is missing") from None
    except (TypeError, ValueError, AttributeError, ZeroDivisionError) as exc:
        raise HeaderError(f"header: field config is not an engine config ({exc})") from None
    peaks = header["peaks"]
    if peaks is None:
        return config, None
    return config, DevicePeaks(peaks["device_name"], float(peaks["peak_flops"]), float(peaks["peak_bytes_per_s"]),
                               peaks["source"])
