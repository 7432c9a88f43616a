"""What the engine needs from whatever runs a step: the real ModelRunner, or a simulated one."""

from __future__ import annotations

from collections.abc import Sized
from typing import Protocol

from batchtop.core_engine.sched.request import Sequence
from batchtop.core_engine.sched import SchedulerOutput


class PreparedStep(Protocol):
    logits_rows: Sized  # rows that reach the lm_head (sampled rows, static padding rows)


class SamplerState(Protocol):
    def forget(self, seq: Sequence) -> None: ...

    def reset(self) -> None: ...


class StepRunner(Protocol):
    sampler: SamplerState

    def prepare(self, plan: SchedulerOutput) -> PreparedStep: ...

    def run(self, batch: PreparedStep) -> list[tuple[Sequence, int]]:
        """One token per sequence that completes a step, in plan order (decodes first)."""
        ...
