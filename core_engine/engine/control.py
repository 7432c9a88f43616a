"""Commands the UI (or a script) sends to a running engine; applied between steps, in order."""

from __future__ import annotations

from dataclasses import dataclass

from batchtop.core_engine.engine.request import Request


@dataclass(frozen=True, slots=True)
class SetMode:
    mode: str  # "continuous" or "static"; takes effect at the next admission decision


@dataclass(frozen=True, slots=True)
class SetMaxNumSeqs:
    value: int  # lowering it below the running count stops admissions; nobody is dropped


@dataclass(frozen=True, slots=True)
class AddRequests:
    requests: tuple[Request, ...]  # arrival_s is an offset from the moment the command is applied


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class Reset:
    """Forget all state and start the loaded workload again from t=0."""


Command = SetMode | SetMaxNumSeqs | AddRequests | Abort | Reset
