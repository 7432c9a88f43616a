"""Continuous (iteration-level) batching, as in Orca and vLLM.

Every step: running sequences first (decodes, then prefill chunks under the token budget), then admit
from the queue while a slot, budget and KV blocks are free. A finished sequence leaves at once, so
its slot is refilled at the next step.
"""

from __future__ import annotations

from batchtop.core_engine.sched.scheduler import Scheduler, SchedulerOutput, SchedulingPolicy
from batchtop.core_engine.sched.wait_reason import WaitReason


class ContinuousPolicy(SchedulingPolicy):
    name = "continuous"
    label = "continuous batching"
    description = "a finished sequence leaves at once and the next waiting one takes its slot (vLLM, Orca)"
    pads_finished_rows = False
    admits_mid_batch = True
    token_budgeted = True

    def admit(self, scheduler: Scheduler, out: SchedulerOutput, budget: int | None) -> None:
        s = scheduler
        while s.waiting:
            if len(s.running) >= s.max_num_seqs:
                out.wait_reason = WaitReason.slots_full(len(s.running), s.max_num_seqs)
                return
            if budget == 0:  # a sequence joins only when this step can feed it
                out.wait_reason = WaitReason.token_budget(s.max_num_batched_tokens)
                return
            head = s.waiting[0]
            # Reserve the whole (re)prefill up front: chunks of one prompt never race each other. Its
            # cached prefix (possibly written earlier in this very step) is reused, not recomputed.
            hits = s.block_manager.cached_prefix(head)
            need = s.block_manager.blocks_to_admit(head, head.num_tokens, hits)
            watermark = s.admission_watermark()
            if not s.allocator.can_allocate(need + watermark):
                out.wait_reason = WaitReason.kv_full(need, watermark, s.allocator.num_free_blocks)
                return  # the head (in the policy's admission order) waits for space; nobody overtakes it
            seq = s.admit_head(out, head.num_tokens, hits)
            budget = s.schedule_chunk(out, seq, budget)
