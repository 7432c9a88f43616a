"""Frozen per-step views: what the panels draw, the recorder writes and the metrics fold over.

A snapshot is built once per step by the engine thread and handed over by swapping one reference;
nothing in it is shared with the engine's mutable state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from batchtop.core_engine.model.cost import StepCost
from batchtop.core_engine.sched.request import Phase
from batchtop.core_engine.sched.wait_reason import WaitReason

WAITING_VIEW_LIMIT = 64  # the queue panel never shows more; the full length travels as num_waiting


class SlotState(str, enum.Enum):
    """The one definition of what a slot did in a step; metrics, grid and timeline all use it."""

    WORKING = "working"  # prefill or decode of a live request
    PADDING = "padding"  # static batching: finished, slot still held, row still computed
    BUBBLE = "bubble"  # empty or idle while requests wait for a slot
    FREE = "free"  # empty or idle, and nothing waits (or past a lowered max_num_seqs)


WORKING_PHASES = (Phase.PREFILL, Phase.DECODE)
# a sequence in one of these phases still holds its slot and its KV blocks when the step is over
HOLDING_PHASES = (Phase.PREFILL, Phase.DECODE, Phase.IDLE, Phase.PADDING)


def slot_state(phase: Phase, slot: int, num_waiting: int, max_num_seqs: int, sampled_last: bool = False) -> SlotState:
    """What the slot did in the step. sampled_last: its sequence sampled its last token in this step, so
    a FINISHED (or, in a static batch that goes on, PADDING) slot did useful work in it."""
    if phase in WORKING_PHASES:
        return SlotState.WORKING
    if phase in (Phase.PADDING, Phase.FINISHED):
        return SlotState.WORKING if sampled_last else SlotState.PADDING
    return SlotState.BUBBLE if num_waiting > 0 and slot < max_num_seqs else SlotState.FREE


@dataclass(frozen=True, slots=True)
class SlotView:
    slot: int
    phase: Phase
    request_id: str | None = None
    index: int = -1  # the request's stable number (colour key); -1 for an empty slot
    prompt_len: int = 0
    num_computed: int = 0  # tokens with K/V in the cache
    num_generated: int = 0
    max_tokens: int = 0
    num_prompt_padding: int = 0  # static batching: pad tokens computed left of this prompt in this step
    num_cached: int = 0  # tokens it found in the prefix cache at its latest admission (not computed)


@dataclass(frozen=True, slots=True)
class WaitingView:
    request_id: str
    index: int
    prompt_len: int
    max_tokens: int
    arrival_s: float
    num_preemptions: int


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    request_id: str
    index: int
    prompt_len: int
    num_generated: int
    arrival_s: float
    first_token_s: float | None
    finish_s: float
    num_preemptions: int
    finish_reason: str
    output_token_ids: tuple[int, ...] = ()

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        if self.first_token_s is None or self.num_generated < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.num_generated - 1)

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.arrival_s


@dataclass(frozen=True, slots=True)
class Counters:
    """Running totals since the start (or the last reset) of the run."""

    submitted: int = 0
    rejected: int = 0
    completed: int = 0
    preemptions: int = 0
    steps: int = 0
    prompt_tokens: int = 0  # prompt tokens of admitted requests, counted once each
    generated_tokens: int = 0
    computed_tokens: int = 0  # every token the model processed: padding and recomputation included
    prompt_padding_tokens: int = 0  # static batching's left padding of prompts (part of computed_tokens)
    prefix_queries: int = 0  # prefix cache, as vLLM counts it: prompt tokens new requests looked up at admission
    prefix_hits: int = 0  # ... and found cached (their KV reused, not computed)
    cached_tokens: int = 0  # every token found cached at an admission, readmitted (preempted) requests included


@dataclass(frozen=True, slots=True)
class StepSnapshot:
    step: int  # 1-based index of the forward step; 0 for a view taken between steps
    t: float  # seconds since the run started, at the end of this step
    mode: str
    max_num_seqs: int
    max_num_batched_tokens: int
    step_time_s: float  # whole step: schedule + prepare + forward/sample + postprocess
    schedule_s: float
    prepare_s: float
    forward_s: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_padding_tokens: int  # rows of finished static-batch members, still computed
    num_seqs: int  # rows in this step's forward (padding rows included)
    slots: tuple[SlotView, ...]
    block_owners: tuple[int, ...]  # owning request index per KV block (the oldest holder), -1 when free
    num_free_blocks: int
    waiting: tuple[WaitingView, ...]  # the head of the queue, at most WAITING_VIEW_LIMIT
    num_waiting: int
    wait_reason: WaitReason | None  # why the head of the queue waits, as the scheduler decided
    num_pending_arrivals: int  # requests of the workload whose arrival time has not come yet
    finished: tuple[FinishedRequest, ...]  # finished during this step
    admitted: tuple[str, ...]
    preempted: tuple[str, ...]
    rejected: tuple[tuple[str, str], ...]  # (request id, reason) refused during this step
    counters: Counters
    arrived: tuple[WaitingView, ...] = ()  # requests that joined the queue since the last snapshot
    controls: tuple[tuple[str, object], ...] = ()  # commands applied since the last snapshot
    cost: StepCost = StepCost()
    # the step's decode rows alone (static padding rows among them), its prompt chunks left out: what the
    # Roofline verdict asks of a decode batch when every step also carries a prompt chunk
    decode_cost: StepCost = StepCost()
    num_prompt_padding_tokens: int = 0  # static batching: pad tokens left of the batch's shorter prompts
    new_tokens: tuple[tuple[str, int], ...] = ()  # (request id, token) sampled in this step: what a server streams
    # holders per KV block (2+: shared through the prefix cache), 0 free, -1 (kv_cache.CACHED) free but
    # holding a cached prefix (evictable); () when the engine runs without a prefix cache (or an old trace)
    block_refs: tuple[int, ...] = ()
    # how many times as fast as recorded the workload's arrivals play (closed-loop pacing, run.pacing);
    # None when they come at their own times
    arrival_speed: float | None = None

    @property
    def num_tokens(self) -> int:
        return (self.num_prefill_tokens + self.num_decode_tokens + self.num_padding_tokens
                + self.num_prompt_padding_tokens)

    @property
    def num_decode_rows(self) -> int:
        return self.num_decode_tokens + self.num_padding_tokens

    @property
    def num_blocks(self) -> int:
        return len(self.block_owners)

    @property
    def num_used_blocks(self) -> int:
        return len(self.block_owners) - self.num_free_blocks

    @property
    def is_step(self) -> bool:
        return self.step > 0

    @property
    def num_running(self) -> int:
        """Sequences that still hold a slot when the step is over and have work left (padding rows have none)."""
        return sum(s.phase in (Phase.PREFILL, Phase.DECODE, Phase.IDLE) for s in self.slots)

    def held_by_drain(self) -> frozenset[int]:
        """Vacant slots under max_num_seqs that sequences past a lowered max_num_seqs count against: a
        lowered limit drops no running sequence, so while n of them drain, n vacancies under it (the
        highest: the scheduler fills the lowest first) cannot be filled. They are no bubbles."""
        past = sum(s.phase is not Phase.EMPTY for s in self.slots[self.max_num_seqs:])
        vacant = [s.slot for s in self.slots[:self.max_num_seqs] if s.phase is Phase.EMPTY]
        return frozenset(vacant[len(vacant) - min(past, len(vacant)):])

    def slot_states(self) -> tuple[SlotState, ...]:
        """What each slot did in this step (metrics fold these): a sequence that sampled its last token
        worked in it, though the frame shows it finished (or, static, as padding from now on)."""
        last = {f.index for f in self.finished}
        held = self.held_by_drain()
        return tuple(SlotState.FREE if s.slot in held else
                     slot_state(s.phase, s.slot, self.num_waiting, self.max_num_seqs, s.index in last)
                     for s in self.slots)
