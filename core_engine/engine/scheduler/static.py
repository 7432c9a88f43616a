"""Static batching, as a fixed-list `generate()` call does it.

Admit up to max_num_seqs only when nothing is running, then run that group until every member has
finished. Early finishers keep their slot as padding and their rows are still computed (Hugging Face
generate keeps decoding finished rows); nobody joins mid-batch, so the queue waits for the whole batch.
"""

from __future__ import annotations

from batchtop.core_engine.engine.scheduler.base import Scheduler


class StaticPolicy:
    name = "static"
    keeps_finished = True

    def admission_open(self, scheduler: Scheduler) -> bool:
        return not scheduler.running

    def admits_without_budget(self) -> bool:
        return True  # the group is fixed at admission; members prefill as the token budget allows
