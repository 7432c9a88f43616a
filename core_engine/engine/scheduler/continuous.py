"""Continuous (iteration-level) batching, as in Orca and vLLM.

Every step: running sequences first, then admit from the queue while a slot, token budget and KV
blocks are free. A finished sequence leaves at once, so its slot is refilled at the next step.
"""

from __future__ import annotations

from batchtop.core_engine.engine.scheduler.base import Scheduler


class ContinuousPolicy:
    name = "continuous"
    keeps_finished = False

    def admission_open(self, scheduler: Scheduler) -> bool:
        return True

    def admits_without_budget(self) -> bool:
        return False  # a sequence joins only when this step can feed it
