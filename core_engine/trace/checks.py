"""The checks a trace's values go through as it is read: each says what is wrong with a value, or None.

Shared by the engine's schema (schema.py, and the checks field_types.py derives from the snapshot
dataclasses) and by attach recordings' (attach/record/record_schema.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

Check = Callable[[object], str | None]  # None when the value is good, else what is wrong with it
# What a number in a trace may be: finite is not enough, a replay sums times and costs over every step
# and a fit squares them. Far past any real session (31,700 years; 1e30 FLOPs or bytes in one step;
# counts a float holds exactly), so only a damaged or hand-edited line meets them.
MAX_SECONDS = 1e12
MAX_WORK = 1e30
MAX_COUNT = 2 ** 53
MAX_LENGTH = 2 ** 63 - 1


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


def boolean(v: object) -> str | None:
    return None if isinstance(v, bool) else f"must be true or false, got {v!r}"


def one_of(choices: tuple[str, ...]) -> Check:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}, got {v!r}"


def optional(check: Check) -> Check:
    return lambda v: None if v is None else check(v)


def anything(v: object) -> str | None:
    return None


def _counts(lengths: Sequence[int]) -> str:
    lengths = sorted(lengths)
    if len(lengths) > 2 and lengths == list(range(lengths[0], lengths[-1] + 1)):
        return f"{lengths[0]} to {lengths[-1]}"
    return " or ".join(map(str, lengths))


def list_of(check: Check, *, lengths: Sequence[int] | None = None, even: bool = False) -> Check:
    def check_list(v: object) -> str | None:
        if not isinstance(v, list):
            return f"must be a list, got {v!r}"
        if lengths is not None and len(v) not in lengths:
            return f"must have {_counts(lengths)} entries, has {len(v)}"
        if even and len(v) % 2:
            return f"must have an even number of entries (pairs), has {len(v)}"
        for i, item in enumerate(v):
            problem = check(item)
            if problem is not None:
                return f"[{i}] {problem}"
        return None
    return check_list


def entries(checks: Sequence[Check], at_least: int) -> Check:
    """A list whose i-th entry passes checks[i]; the last ones may be missing (fields an older trace
    lacks), never the first `at_least`."""
    def check_entries(v: object) -> str | None:
        problem = list_of(anything, lengths=range(at_least, len(checks) + 1))(v)
        if problem is not None:
            return problem
        for i, (item, check) in enumerate(zip(v, checks)):  # type: ignore[call-overload]
            problem = check(item)
            if problem is not None:
                return f"[{i}] {problem}"
        return None
    return check_entries
