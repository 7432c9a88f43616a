"""One step's plan, as the scheduler hands it to the runner (vLLM's SchedulerOutput)."""

from __future__ import annotations

from dataclasses import dataclass, field

from batchtop.core_engine.sched.request import Sequence
from batchtop.core_engine.sched.wait_reason import WaitReason


@dataclass(slots=True)
class SchedulerOutput:
    """One step's plan: who runs how many tokens, and what changed to make room."""

    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)  # decodes first, then prefill chunks
    padding: list[Sequence] = field(default_factory=list)  # static batching's finished rows, still computed
    prompt_padding: list[tuple[Sequence, int]] = field(default_factory=list)  # static: pad tokens left of a prompt
    admitted: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    token_budget: int | None = None  # the budget this step was held to; None: a static step, unbudgeted
    wait_reason: WaitReason | None = None  # why the head of the queue still waits after this plan
    # prefix caching, as vLLM counts it: tokens new requests looked up and found at admission; cached_tokens
    # also counts what readmitted (preempted) requests found again
    prefix_queries: int = 0
    prefix_hits: int = 0
    cached_tokens: int = 0

    @property
    def num_prompt_padding(self) -> int:
        return sum(n for _, n in self.prompt_padding)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled) + len(self.padding) + self.num_prompt_padding

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.padding
