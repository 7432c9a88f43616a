"""Commands the UI (or a script) sends to a running engine; applied between steps, in order."""

from __future__ import annotations

from dataclasses import dataclass

from batchtop.core_engine.sched.request import Request


@dataclass(frozen=True, slots=True)
class SetMode:
    mode: str  # "continuous" or "static"; takes effect at the next admission decision


@dataclass(frozen=True, slots=True)
class SetMaxNumSeqs:
    value: int  # lowering it below the running count stops admissions; nobody is dropped


@dataclass(frozen=True, slots=True)
class ToggleMode:
    """static <-> continuous from the mode in force when it is applied, so two quick presses cancel."""


@dataclass(frozen=True, slots=True)
class ChangeMaxNumSeqs:
    """max_num_seqs x multiply + add, from the value in force when applied: fifty quick `+` presses add
    fifty. Clamped to 1..min(4096, max_num_batched_tokens)."""
    add: int = 0
    multiply: float = 1.0


@dataclass(frozen=True, slots=True)
class AddRequests:
    requests: tuple[Request, ...]  # each one's arrival_s is an offset from the base below
    source: str = "burst"  # the control event's name in snapshots and traces ("http" for served requests)
    arrival_s: float | None = None  # base run time (engine.now() when received); None: when applied


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class Reset:
    """Forget all state and start the loaded workload again from t=0."""


Command = SetMode | ToggleMode | SetMaxNumSeqs | ChangeMaxNumSeqs | AddRequests | Abort | Reset
