"""The scheduler's mechanics, shared by every policy: queues, slots, budgets, preemption, and the update
after each forward (tokens appended, stops detected, blocks freed), as vLLM's scheduler owns it.

A policy (a SchedulingPolicy subclass in its own file, named in the registry, policies.py) decides when,
in what order and how waiting sequences are admitted, whom to preempt, whether a step is held to the
token budget, and whether a finished sequence leaves its slot at once or stays as padding until its
batch ends. Keeping the state here lets the mode flip between steps without losing or copying anything.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Container, Iterable
from typing import ClassVar

from batchtop.core_engine.sched.kv_cache import BlockManager
from batchtop.core_engine.sched.output import SchedulerOutput
from batchtop.core_engine.sched.request import FinishReason, Sequence, SeqStatus
from batchtop.core_engine.sched.stop import stop_reason
from batchtop.core_engine.sched.wait_reason import WaitReason

ADMISSION_WATERMARK = 0.01  # keep 1% of blocks free when admitting beside others (vLLM does too)


class SchedulingPolicy(ABC):
    """Traits the rest of batchtop asks instead of comparing mode names, and the hooks the scheduler calls.
    The hooks' defaults are vLLM's: first come, first served, and the sequence admitted last is
    preempted first."""

    name: ClassVar[str]  # the mode's name: --mode, the trace, metrics files, the compare keys
    label: ClassVar[str]  # how the dashboard and reports say it ("continuous batching")
    description: ClassVar[str]  # one line for --help
    # a finished sequence keeps its slot and its row is still computed until its whole batch ends
    pads_finished_rows: ClassVar[bool] = False
    # a waiting sequence may join while others run (so a pacer can hold the slots at a target occupancy)
    admits_mid_batch: ClassVar[bool] = True
    token_budgeted: ClassVar[bool] = True  # steps are held to max_num_batched_tokens (chunked prefill)

    @abstractmethod
    def admit(self, scheduler: Scheduler, out: SchedulerOutput, budget: int | None) -> None:
        """Move sequences from the head of scheduler.waiting into slots for this step, or set
        out.wait_reason saying why the head waits."""

    def admission_order(self, waiting: deque[Sequence]) -> Iterable[Sequence]:
        """The waiting queue in the order to admit it, head first; the scheduler applies it before each
        admission decision. Returning `waiting` itself keeps the order (first come, first served, with
        preempted sequences back at the head)."""
        return waiting

    def preemption_victim(self, candidates: list[Sequence]) -> Sequence:
        """Whom to preempt when a running sequence cannot grow. `candidates`, in admission order, are the
        running sequences given no tokens yet this step, the one that needs room among them."""
        return candidates[-1]


class Scheduler:
    """Queues, slot assignment and the per-step plan under max_num_seqs / max_num_batched_tokens."""

    def __init__(self, block_manager: BlockManager, policy: SchedulingPolicy, max_num_seqs: int,
                 max_num_batched_tokens: int, eos_token_ids: Container[int] = frozenset()) -> None:
        self.block_manager = block_manager
        self.eos_token_ids = eos_token_ids  # empty for the random presets
        self.allocator = block_manager.allocator
        self.policy = policy
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order, oldest first
        self._used_slots: set[int] = set()
        self.wait_reason: WaitReason | None = None  # from the latest plan; views between steps show it

    # -- queue management ---------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting) or any(not s.padding for s in self.running)

    def num_slots(self) -> int:
        """Slots the grid shows: max_num_seqs, or more while a lowered cap still has old occupants."""
        return max(self.max_num_seqs, max(self._used_slots, default=-1) + 1)

    # -- the per-step plan --------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens if self.policy.token_budgeted else None
        out = SchedulerOutput(token_budget=budget)
        if not self.policy.pads_finished_rows:
            for seq in [s for s in self.running if s.padding]:  # the mode flipped to continuous
                self._release(seq)
        budget = self._schedule_decodes(out, budget)
        budget = self._schedule_prefills(out, budget)
        out.padding = [s for s in self.running if s.padding]  # computed whatever the budget, as generate() does
        self._order_queue()
        if out.preempted and self.waiting:
            out.wait_reason = WaitReason.preempted()  # never readmit a victim in the step that evicted it
        else:
            self.policy.admit(self, out, budget)
        if not self.waiting:
            out.wait_reason = None
        self.wait_reason = out.wait_reason
        assert out.token_budget is None or out.num_tokens <= out.token_budget, "token budget overrun"
        return out

    def _schedule_decodes(self, out: SchedulerOutput, budget: int | None) -> int | None:
        for seq in [s for s in self.running if not s.padding and not s.is_prefill]:
            if budget == 0:
                break
            if seq.status is not SeqStatus.RUNNING:  # preempted earlier in this loop
                continue
            need = seq.num_computed_tokens + 1
            while not self.block_manager.can_grow(seq, need):
                victim = self._preemption_victim(out)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is SeqStatus.RUNNING:
                self.block_manager.grow(seq, need)
                if need % self.block_manager.block_size == 0:  # this decode fills its block: key it
                    self.block_manager.cache_blocks(seq, seq.num_computed_tokens, need)
                out.scheduled.append((seq, 1))
                budget = None if budget is None else budget - 1
        return budget

    def _schedule_prefills(self, out: SchedulerOutput, budget: int | None) -> int | None:
        for seq in self.running:
            if budget == 0:
                break
            if seq.status is SeqStatus.RUNNING and not seq.padding and seq.is_prefill:
                budget = self.schedule_chunk(out, seq, budget)
        return budget

    def schedule_chunk(self, out: SchedulerOutput, seq: Sequence, budget: int | None) -> int | None:
        """The rest of seq's prompt, or as much as the budget allows (chunked prefill)."""
        chunk = seq.num_uncomputed if budget is None else min(seq.num_uncomputed, budget)
        self.block_manager.cache_blocks(seq, seq.num_computed_tokens, seq.num_computed_tokens + chunk)
        out.scheduled.append((seq, chunk))
        return None if budget is None else budget - chunk

    def admission_watermark(self) -> int:
        """Blocks kept free when admitting beside running sequences, so they can still grow."""
        return int(ADMISSION_WATERMARK * self.allocator.num_blocks) if self.running else 0

    def admit_head(self, out: SchedulerOutput, kv_tokens: int, hits: list[int]) -> Sequence:
        """Give the head of the queue a slot, its cached prefix `hits` (block_manager.cached_prefix) and
        new KV blocks up to kv_tokens of its tokens."""
        seq = self.waiting.popleft()
        self.block_manager.admit(seq, kv_tokens, hits)
        if self.allocator.cache is not None:
            out.cached_tokens += seq.num_cached_tokens
            if seq.num_preemptions == 0:  # vLLM counts a readmitted request's lookup apart
                out.prefix_queries += seq.num_tokens
                out.prefix_hits += seq.num_cached_tokens
        seq.status = SeqStatus.RUNNING
        seq.slot = self._take_slot()
        self.running.append(seq)
        out.admitted.append(seq)
        return seq

    # -- state changes after the forward ------------------------------------------------------
    def update_from_output(self, plan: SchedulerOutput, sampled: list[tuple[Sequence, int]],
                           now: float) -> list[Sequence]:
        """The step ran: the planned tokens' KV is written and each sequence that completed its chunk
        sampled one token. Append those tokens, finish the sequences that stop (freeing their slots and
        blocks, or keeping them as padding), and end a static batch whose members all finished.
        Returns the sequences that finished in this step, in plan order."""
        for seq, n in plan.scheduled:
            seq.num_computed_tokens += n
        finished: list[Sequence] = []
        for seq, token in sampled:
            seq.token_ids.append(token)
            if seq.first_token_s is None:
                seq.first_token_s = now
            reason = stop_reason(seq, token, self.eos_token_ids)
            if reason is not None:
                seq.finish_s = now
                self.finish(seq, reason)
                finished.append(seq)
        self.end_step()
        return finished

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        if self.policy.pads_finished_rows:
            seq.padding = True
        else:
            self._release(seq)

    def end_step(self) -> list[Sequence]:
        """Release a static batch once every member has finished; returns the released members."""
        if self.running and all(s.padding for s in self.running):
            batch = list(self.running)
            for seq in batch:
                self._release(seq)
            return batch
        return []

    def abort(self, request_id: str) -> Sequence | None:
        """Drop a request wherever it is; unknown or finished ids are a no-op (no double free)."""
        for seq in self.waiting:
            if seq.id == request_id:
                self.waiting.remove(seq)
                self.block_manager.release(seq)
                seq.status, seq.finish_reason = SeqStatus.FINISHED, FinishReason.ABORT
                return seq
        for seq in self.running:
            if seq.id == request_id and not seq.padding:
                self._release(seq)
                seq.status, seq.finish_reason = SeqStatus.FINISHED, FinishReason.ABORT
                self.end_step()
                return seq
        return None

    # -- internals ----------------------------------------------------------------------------
    def _order_queue(self) -> None:
        ordered = self.policy.admission_order(self.waiting)
        if ordered is not self.waiting:
            ordered = list(ordered)
            assert len(ordered) == len(self.waiting) and set(ordered) == set(self.waiting), \
                f"{self.policy.name}: admission_order must reorder the queue, not change it"
            self.waiting.clear()
            self.waiting.extend(ordered)

    def _preemption_victim(self, out: SchedulerOutput) -> Sequence:
        """The policy's pick among the running sequences this step has given no tokens yet: a sequence
        already in the plan is never evicted under it."""
        planned = {seq for seq, _ in out.scheduled}
        candidates = [s for s in self.running if not s.padding and s not in planned]
        victim = self.policy.preemption_victim(candidates)
        assert victim in candidates, f"{self.policy.name}: preemption_victim must pick one of its candidates"
        return victim

    def _preempt(self, seq: Sequence) -> None:
        """Preempt by recompute: free its blocks, forget its KV, back to the head of the queue."""
        self.running.remove(seq)
        self._used_slots.discard(seq.slot)
        seq.slot = None
        self.block_manager.release(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)

    def _release(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._used_slots.discard(seq.slot)
        seq.slot = None
        seq.padding = False
        self.block_manager.release(seq)

    def _take_slot(self) -> int:
        slot = 0
        while slot in self._used_slots:
            slot += 1
        self._used_slots.add(slot)
        return slot

    def reset(self) -> None:
        self.waiting.clear()
        self.running.clear()
        self._used_slots.clear()
        self.wait_reason = None

    def check_invariants(self) -> None:
        """I2-I4 of the reliability checklist; raises AssertionError on the first violation."""
        self.allocator.check_invariants()
        tables: dict[int, int] = {}  # block -> block tables naming it
        for seq in [*self.running, *self.waiting]:
            assert len(set(seq.block_table)) == len(seq.block_table), f"a block twice in {seq.id}'s table"
            for b in seq.block_table:
                tables[b] = tables.get(b, 0) + 1
            self.block_manager.check_cached_blocks(seq)
        assert len(tables) == self.allocator.num_used_blocks, "used blocks and block tables disagree"
        for b, n in tables.items():
            assert self.allocator.ref_count(b) == n, f"block {b}: ref count {self.allocator.ref_count(b)}, {n} tables"
        slots = [s.slot for s in self.running]
        assert None not in slots and len(set(slots)) == len(slots), f"bad slot assignment {slots}"
        assert set(slots) == self._used_slots, "slot set out of sync"
        for seq in self.running:
            assert seq.status is (SeqStatus.FINISHED if seq.padding else SeqStatus.RUNNING)
            assert len(seq.block_table) * self.block_manager.block_size >= seq.num_computed_tokens
        for seq in self.waiting:
            assert seq.status is SeqStatus.WAITING and seq.slot is None
            assert seq.num_computed_tokens == 0 and not seq.block_table
