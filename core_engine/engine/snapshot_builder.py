"""Builds the frozen StepSnapshot from the engine's live state at the end of a step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from batchtop.core_engine.engine.request import Phase, Sequence
from batchtop.core_engine.engine.scheduler import SchedulerOutput
from batchtop.core_engine.engine.snapshot import (WAITING_VIEW_LIMIT, FinishedRequest, SlotView, StepCost, StepSnapshot,
                                  WaitingView)

if TYPE_CHECKING:
    from batchtop.core_engine.engine.engine import Engine

Occupant = tuple[int, Sequence, Phase]


def slot_occupants(running: list[Sequence], plan: SchedulerOutput | None) -> list[Occupant]:
    """Who holds each slot during this step, and doing what; taken before finished ones leave."""
    if plan is None:  # between steps: what each occupant will do next
        return [(s.slot, s, Phase.PADDING if s.padding else Phase.PREFILL if s.is_prefill else Phase.DECODE)
                for s in running]
    scheduled = {seq.index: seq.is_prefill for seq, _ in plan.scheduled}
    padding = {seq.index for seq in plan.padding}
    out = []
    for s in running:
        if s.index in padding or s.padding:
            phase = Phase.PADDING
        elif s.index in scheduled:
            phase = Phase.PREFILL if scheduled[s.index] else Phase.DECODE
        else:
            phase = Phase.IDLE
        out.append((s.slot, s, phase))
    return out


def build_snapshot(engine: Engine, plan: SchedulerOutput, finished: list[FinishedRequest], *, step: int,
                   t: float, times: tuple[float, float, float, float], cost: StepCost,
                   occupants: list[Occupant], num_prefill_tokens: int = 0) -> StepSnapshot:
    sched = engine.scheduler
    by_slot = {slot: (seq, phase) for slot, seq, phase in occupants}
    num_slots = max(sched.num_slots(), max(by_slot, default=-1) + 1)
    slots = []
    for i in range(num_slots):
        if i not in by_slot:
            slots.append(SlotView(i, Phase.EMPTY))
            continue
        seq, phase = by_slot[i]
        slots.append(SlotView(i, phase, seq.id, seq.index, seq.prompt_len, seq.num_computed_tokens,
                              seq.num_output_tokens, seq.max_tokens))
    waiting = tuple(WaitingView(s.id, s.index, s.prompt_len, s.max_tokens, s.arrival_s, s.num_preemptions)
                    for _, s in zip(range(WAITING_VIEW_LIMIT), sched.waiting))
    total, schedule_s, prepare_s, forward_s = times
    arrived, rejected, controls = engine.take_events()
    return StepSnapshot(
        step=step, t=t, mode=engine.mode, max_num_seqs=sched.max_num_seqs,
        max_num_batched_tokens=sched.max_num_batched_tokens, step_time_s=total, schedule_s=schedule_s,
        prepare_s=prepare_s, forward_s=forward_s, num_prefill_tokens=num_prefill_tokens,
        num_decode_tokens=sum(n for _, n in plan.scheduled) - num_prefill_tokens,
        num_padding_tokens=len(plan.padding), num_seqs=len(plan.scheduled) + len(plan.padding),
        slots=tuple(slots), block_owners=engine.allocator.owners(),
        num_free_blocks=engine.allocator.num_free_blocks, waiting=waiting, num_waiting=len(sched.waiting),
        num_pending_arrivals=engine.num_pending_arrivals, finished=tuple(finished),
        admitted=tuple(s.id for s in plan.admitted), preempted=tuple(s.id for s in plan.preempted),
        rejected=rejected, arrived=arrived, controls=controls, counters=engine.counters, cost=cost)

