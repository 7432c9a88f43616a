"""The one registry of scheduling policies: mode name -> policy class (its traits and hooks).

Everything that names modes reads it: config validation and config.MODES, --mode's choices, the
dashboard's toggle key (the next mode in this order), `batchtop compare`'s pair, the trace. A new policy
is a SchedulingPolicy subclass in its own file and one line here. Nothing here imports
core_engine.config (config imports this module).
"""

from __future__ import annotations

from batchtop.core_engine.sched.continuous import ContinuousPolicy
from batchtop.core_engine.sched.scheduler import SchedulingPolicy
from batchtop.core_engine.sched.static import StaticPolicy

POLICIES: dict[str, type[SchedulingPolicy]] = {
    ContinuousPolicy.name: ContinuousPolicy,
    StaticPolicy.name: StaticPolicy,
}
DEFAULT_MODE = ContinuousPolicy.name
# `batchtop compare` runs the baseline, then the policy measured against it; its JSON keys are these names
COMPARE_BASELINE, COMPARE_CANDIDATE = StaticPolicy.name, ContinuousPolicy.name


def mode_names() -> tuple[str, ...]:
    return tuple(POLICIES)


def mode_problem(mode: object) -> str | None:
    """What is wrong with `mode` as a mode name, or None when the registry knows it."""
    if isinstance(mode, str) and mode in POLICIES:
        return None
    return f"must be one of {', '.join(POLICIES)}, got {mode!r}"


def policy_class(mode: str) -> type[SchedulingPolicy]:
    """The policy registered under `mode` (its traits are class attributes); ValueError if unknown."""
    problem = mode_problem(mode)
    if problem is not None:
        raise ValueError(f"mode {problem}")
    return POLICIES[mode]


def make_policy(mode: str) -> SchedulingPolicy:
    return policy_class(mode)()


def next_mode(mode: str) -> str:
    """The mode the dashboard's toggle key switches to: the next in the registry's order, round."""
    names = mode_names()
    return names[(names.index(mode) + 1) % len(names)] if mode in names else DEFAULT_MODE
