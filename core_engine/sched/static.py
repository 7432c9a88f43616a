"""Static batching, as a fixed-list `generate()` call does it.

Admit up to max_num_seqs only when nothing is running, as one unit: each member's KV for its whole
prompt + max_tokens is reserved at once (so a static batch never preempts), every prompt is
left-padded to the batch's longest and the batch is prefilled in one step, pad tokens computed. Then
the members decode in lockstep; early finishers keep their slot as padding and their rows are still
computed (Hugging Face's generate keeps decoding finished rows); nobody joins mid-batch, so the queue
waits for the whole batch. The token budget does not apply to the plan (generate() has none); the
runner still runs an over-budget prefill as forwards within it (worker/forward_pieces.py).
"""

from __future__ import annotations

from batchtop.core_engine.sched.request import Sequence
from batchtop.core_engine.sched.scheduler import Scheduler, SchedulerOutput, SchedulingPolicy
from batchtop.core_engine.sched.wait_reason import WaitReason


def kv_tokens_for_whole_request(seq: Sequence) -> int:
    """prompt + max_tokens, less the last sampled token, which is never fed back."""
    return seq.prompt_len + seq.max_tokens - 1


class StaticPolicy(SchedulingPolicy):
    name = "static"
    label = "static batching"
    description = "a batch runs until its last member ends; finished rows stay as padding (generate())"
    pads_finished_rows = True
    admits_mid_batch = False
    token_budgeted = False

    def admit(self, scheduler: Scheduler, out: SchedulerOutput, budget: int | None) -> None:
        s = scheduler
        if s.running:
            out.wait_reason = WaitReason.static_batch(len(s.running))
            return
        group: list[Sequence] = []
        while s.waiting and len(group) < s.max_num_seqs:
            head = s.waiting[0]
            kv_tokens = kv_tokens_for_whole_request(head)
            hits = s.block_manager.cached_prefix(head)  # the prefix cache is the allocator's: as in continuous
            need = s.block_manager.blocks_to_admit(head, kv_tokens, hits)
            if not s.allocator.can_allocate(need):
                out.wait_reason = WaitReason.kv_static(len(group), need, s.allocator.num_free_blocks)
                break
            group.append(s.admit_head(out, kv_tokens, hits))
            s.schedule_chunk(out, group[-1], None)  # its blocks are keyed now: a later member finds them
        else:
            if s.waiting:
                out.wait_reason = WaitReason.static_batch(len(group))
        # pad to the longest computed chunk; pad tokens write to scratch, so they are never cached
        longest = max((seq.num_uncomputed for seq in group), default=0)
        for seq in group:
            if seq.num_uncomputed < longest:
                out.prompt_padding.append((seq, longest - seq.num_uncomputed))


