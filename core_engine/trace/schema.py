"""What each line of a batchtop.trace must hold, checked as it is read, so a damaged or hand-edited
trace fails with its line and field named instead of a KeyError deep in a replay.

Checks are per trace source (the header's "source"; an engine session has none, or "engine"): another
source registers its own event schemas in SOURCES. A source with no entry gets the framing checks
only (seq, t, type), and its events are passed through for its own reader.
"""

from __future__ import annotations

from batchtop.core_engine.config import MODES, EngineConfig, config_from_dict
from batchtop.core_engine.sched.wait_reason import WaitKind
from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.trace.checks import (MAX_LENGTH, Check, _is_int, _is_num, anything, entries, integer,
                                               list_of, number, one_of, optional, text)
from batchtop.core_engine.trace.codec import PHASE_CODE
from batchtop.core_engine.trace.layout import (ARRIVAL, CELL_FIELDS, COST, COUNTERS, FINISH, PACKS, SLOT_CELL_HEAD,
                                               STEP_NAMED, Named)

ENGINE_SOURCE = "engine"
PEAK_RANGES = {"peak_flops": (1e3, 1e21), "peak_bytes_per_s": (1e3, 1e18)}  # from a microcontroller to a rack
_COUNT = integer(0)
_TIME = number(0.0)
_CELL_NAMES = ", ".join(f.name for f in CELL_FIELDS[:SLOT_CELL_HEAD]) + "".join(
    f"(, {f.name}" for f in CELL_FIELDS[SLOT_CELL_HEAD:]) + ")" * (len(CELL_FIELDS) - SLOT_CELL_HEAD)


def _slot(v: object) -> str | None:
    """0 for an empty slot, else [request index, phase code, then the slot's own numbers (layout.CELL_FIELDS:
    computed, generated(, prompt padding(, cached)))]."""
    if v == 0 and _is_int(v):
        return None
    if not isinstance(v, list) or not 2 + SLOT_CELL_HEAD <= len(v) <= 2 + len(CELL_FIELDS):
        return f"must be 0 or [index, phase, {_CELL_NAMES}], got {v!r}"
    if v[1] not in PHASE_CODE.values():
        return f"phase must be one of {', '.join(PHASE_CODE.values())}, got {v[1]!r}"
    problem = _COUNT(v[0])
    if problem is None:
        problem = next((p for f, x in zip(CELL_FIELDS, v[2:]) if (p := f.type.check(x)) is not None), None)
    return None if problem is None else f"{problem} (in {v!r})"


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


# tighter than what a field's type allows (field_types.py), by event; a new field needs no entry
_TIMES = {"step_time_s": _TIME, "schedule_s": _TIME, "prepare_s": _TIME, "forward_s": _TIME}
STEP_TIGHTER: dict[str, Check] = {"t": _TIME, "mode": one_of(MODES), "max_num_seqs": integer(1),
                                  "max_num_batched_tokens": integer(1), "arrival_speed": _TIME, **_TIMES}
# a request refused for its size arrives too: lengths up to what a workload may give (2**63-1)
ARRIVAL_TIGHTER: dict[str, Check] = {"prompt_len": integer(1, MAX_LENGTH), "max_tokens": integer(1, MAX_LENGTH),
                                     "arrival_s": _TIME}
FINISH_TIGHTER: dict[str, Check] = {"arrival_s": _TIME, "first_token_s": optional(_TIME), "finish_s": _TIME}


def checks_of(fields: tuple[Named, ...], required: bool, tighter: dict[str, Check]) -> dict[str, Check]:
    return {f.key: tighter.get(f.name, f.type.check) for f in fields if f.required == required}


STEP_FIELDS: dict[str, Check] = {
    **checks_of(STEP_NAMED, True, STEP_TIGHTER),
    **{p.key: entries([STEP_TIGHTER.get(f.name, f.type.check) for f in p.fields], p.at_least) for p in PACKS},
    "slots": list_of(_slot), "waiting": list_of(_COUNT, even=True), "counters": COUNTERS.check, "cost": COST.check,
}
OPTIONAL_STEP_FIELDS: dict[str, Check] = {**checks_of(STEP_NAMED, False, STEP_TIGHTER), "wait": optional(_wait),
                                          "kv": _runs, "kv_refs": _runs, "decode_cost": COST.check}


def _text_pair(v: object) -> str | None:
    ok = isinstance(v, list) and len(v) == 2 and _is_int(v[0]) and v[0] >= 0 and isinstance(v[1], str)
    return None if ok else f"must be [request index, text], got {v!r}"


_PAIRS = list_of(_text_pair)

# event type -> (required fields, optional fields)
ENGINE_EVENTS: dict[str, tuple[dict[str, Check], dict[str, Check]]] = {
    "control": ({"name": text}, {"value": anything}),
    "arrival": (checks_of(ARRIVAL, True, ARRIVAL_TIGHTER), checks_of(ARRIVAL, False, ARRIVAL_TIGHTER)),
    "reject": ({"id": text, "reason": text}, {}),
    "finish": (checks_of(FINISH, True, FINISH_TIGHTER), checks_of(FINISH, False, FINISH_TIGHTER)),
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
