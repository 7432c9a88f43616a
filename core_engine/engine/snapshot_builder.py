"""Builds the frozen StepSnapshot from the scheduler's and allocator's live state at the end of a step.

The engine hands over its parts explicitly; nothing here knows the Engine class.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchtop.core_engine.sched.kv_cache import BlockAllocator
from batchtop.core_engine.sched.request import Phase, Sequence
from batchtop.core_engine.sched import Scheduler, SchedulerOutput
from batchtop.core_engine.sched.wait_reason import WaitKind, WaitReason
from batchtop.core_engine.engine.snapshot import (WAITING_VIEW_LIMIT, Counters, FinishedRequest, SlotView,
                                                  StepSnapshot, WaitingView)
from batchtop.core_engine.model.cost import StepCost

Occupant = tuple[int, Sequence, Phase, int]  # slot, sequence, phase, prompt pad tokens this step


@dataclass(frozen=True, slots=True)
class StepEvents:
    """What happened since the last snapshot besides the step itself; the snapshot owns it."""

    arrived: tuple[WaitingView, ...] = ()
    rejected: tuple[tuple[str, str], ...] = ()
    controls: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True, slots=True)
class StepTimes:
    total: float = 0.0
    schedule: float = 0.0
    prepare: float = 0.0
    forward: float = 0.0


def slot_occupants(running: list[Sequence], plan: SchedulerOutput | None) -> list[Occupant]:
    """Who holds each slot during this step, and doing what; taken before finished ones leave."""
    if plan is None:  # between steps: what each occupant will do next
        return [(s.slot, s, Phase.PADDING if s.padding else Phase.PREFILL if s.is_prefill else Phase.DECODE, 0)
                for s in running]
    scheduled = {seq.index: seq.is_prefill for seq, _ in plan.scheduled}
    padding = {seq.index for seq in plan.padding}
    prompt_pad = {seq.index: n for seq, n in plan.prompt_padding}
    out = []
    for s in running:
        if s.index in padding or s.padding:
            phase = Phase.PADDING
        elif s.index in scheduled:
            phase = Phase.PREFILL if scheduled[s.index] else Phase.DECODE
        else:
            phase = Phase.IDLE
        out.append((s.slot, s, phase, prompt_pad.get(s.index, 0)))
    return out


def settle(occupants: list[Occupant]) -> list[Occupant]:
    """The occupants as the step leaves them, so the slots describe the same moment as the block map
    (taken after postprocess): a sequence released in this step (finished, or its static batch over)
    is FINISHED, its KV already free; a static member that finished but still holds its slot is PADDING."""
    out = []
    for slot, seq, phase, pad in occupants:
        if seq.slot is None:
            phase = Phase.FINISHED
        elif seq.padding:
            phase = Phase.PADDING
        out.append((slot, seq, phase, pad))
    return out


def wait_reason_after_step(sched: Scheduler, finished: int) -> WaitReason | None:
    """The head's reason as the step leaves it. Slots full stays full while the running sequences still
    fill max_num_seqs (a lowered limit drains: a sequence that leaves a slot past it frees no place);
    otherwise only the slots that fell under the limit count as freed."""
    reason = sched.wait_reason
    if not sched.waiting or reason is None:
        return None
    running, limit = len(sched.running), sched.max_num_seqs
    if reason.kind is WaitKind.SLOTS_FULL and running >= limit:
        return WaitReason.slots_full(running, limit)
    return reason.after_step(min(finished, max(0, limit - running)))


def build_snapshot(sched: Scheduler, allocator: BlockAllocator, counters: Counters, events: StepEvents,
                   plan: SchedulerOutput, finished: list[FinishedRequest], *, step: int, t: float,
                   times: StepTimes, cost: StepCost, occupants: list[Occupant], num_pending_arrivals: int,
                   decode_cost: StepCost = StepCost(), num_prefill_tokens: int = 0,
                   new_tokens: tuple[tuple[str, int], ...] = (), arrival_speed: float | None = None) -> StepSnapshot:
    by_slot = {slot: (seq, phase, pad) for slot, seq, phase, pad in occupants}
    num_slots = max(sched.num_slots(), max(by_slot, default=-1) + 1)
    slots = []
    for i in range(num_slots):
        if i not in by_slot:
            slots.append(SlotView(i, Phase.EMPTY))
            continue
        seq, phase, pad = by_slot[i]
        slots.append(SlotView(i, phase, seq.id, seq.index, seq.prompt_len, seq.num_computed_tokens,
                              seq.num_output_tokens, seq.max_tokens, pad, seq.num_cached_tokens))
    waiting = tuple(WaitingView(s.id, s.index, s.prompt_len, s.max_tokens, s.arrival_s, s.num_preemptions)
                    for _, s in zip(range(WAITING_VIEW_LIMIT), sched.waiting))
    return StepSnapshot(
        step=step, t=t, mode=sched.policy.name, max_num_seqs=sched.max_num_seqs,
        max_num_batched_tokens=sched.max_num_batched_tokens, step_time_s=times.total,
        schedule_s=times.schedule, prepare_s=times.prepare, forward_s=times.forward,
        num_prefill_tokens=num_prefill_tokens,
        num_decode_tokens=sum(n for _, n in plan.scheduled) - num_prefill_tokens,
        num_padding_tokens=len(plan.padding), num_prompt_padding_tokens=plan.num_prompt_padding,
        num_seqs=len(plan.scheduled) + len(plan.padding),
        slots=tuple(slots), block_owners=allocator.owners(), num_free_blocks=allocator.num_free_blocks,
        waiting=waiting, num_waiting=len(sched.waiting),
        wait_reason=wait_reason_after_step(sched, sum(s.phase is Phase.FINISHED for s in slots)),
        num_pending_arrivals=num_pending_arrivals, finished=tuple(finished),
        admitted=tuple(s.id for s in plan.admitted), preempted=tuple(s.id for s in plan.preempted),
        rejected=events.rejected, arrived=events.arrived, controls=events.controls, counters=counters, cost=cost,
        decode_cost=decode_cost, new_tokens=new_tokens, arrival_speed=arrival_speed,
        block_refs=allocator.block_refs() if allocator.cache is not None else ())
