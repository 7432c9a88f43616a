"""The scheduler's update after a forward: sampled tokens appended, stops detected, slots and blocks freed
(continuous) or kept as padding until the whole batch ends (static)."""

from __future__ import annotations

from batchtop.core_engine.sched import Scheduler, make_policy
from batchtop.core_engine.sched.kv_cache import BlockAllocator, BlockManager
from batchtop.core_engine.sched.request import FinishReason, Request, SamplingParams, Sequence, SeqStatus

EOS = 1
NUM_BLOCKS = 16


def make_scheduler(mode: str = "continuous") -> Scheduler:
    return Scheduler(BlockManager(BlockAllocator(NUM_BLOCKS, 4)), make_policy(mode), max_num_seqs=4,
                     max_num_batched_tokens=64, eos_token_ids=frozenset({EOS}))


def queue(sched: Scheduler, *requests: Request) -> list[Sequence]:
    seqs = [Sequence(r, i, 0.0) for i, r in enumerate(requests)]
    for seq in seqs:
        sched.add(seq)
    return seqs


def step(sched: Scheduler, tokens: dict[str, int], now: float) -> list[Sequence]:
    """Plan a step and feed back `tokens` (request id -> sampled token) as the runner would."""
    plan = sched.schedule()
    sampled = [(seq, tokens[seq.id]) for seq, _ in plan.scheduled]
    return sched.update_from_output(plan, sampled, now)


def test_sampled_tokens_are_appended_and_the_first_one_timed():
    sched = make_scheduler()
    (seq,) = queue(sched, Request("a", (5, 6, 7), 4))
    assert step(sched, {"a": 9}, now=0.5) == []
    assert seq.token_ids == [5, 6, 7, 9] and seq.num_computed_tokens == 3 and seq.first_token_s == 0.5
    assert step(sched, {"a": 8}, now=0.7) == []
    assert seq.token_ids[-1] == 8 and seq.num_computed_tokens == 4 and seq.first_token_s == 0.5


def test_eos_stops_a_request_keeps_the_token_and_frees_its_slot_and_blocks():
    sched = make_scheduler()
    stops, ignores = queue(sched, Request("stops", (5, 6, 7), 8), Request("ignores", (5, 6), 8,
                                                                         sampling=SamplingParams(ignore_eos=True)))
    step(sched, {"stops": 9, "ignores": 9}, now=0.1)
    finished = step(sched, {"stops": EOS, "ignores": EOS}, now=0.2)
    assert finished == [stops]
    assert stops.finish_reason is FinishReason.STOP and stops.token_ids[-1] == EOS and stops.finish_s == 0.2
    assert stops.status is SeqStatus.FINISHED and stops.slot is None and not stops.block_table
    assert sched.running == [ignores] and ignores.finish_reason is None
    sched.check_invariants()


def test_max_tokens_ends_a_request_with_reason_length():
    sched = make_scheduler()
    (seq,) = queue(sched, Request("a", (5, 6), 2))
    assert step(sched, {"a": 9}, now=0.1) == []
    assert step(sched, {"a": 9}, now=0.2) == [seq]
    assert seq.finish_reason is FinishReason.LENGTH and seq.num_output_tokens == 2
    assert not sched.running and sched.allocator.num_free_blocks == NUM_BLOCKS


def test_static_finished_rows_stay_as_padding_until_the_whole_batch_ends():
    sched = make_scheduler("static")
    short, long = queue(sched, Request("short", (5, 6), 1), Request("long", (7, 8), 3))
    assert step(sched, {"short": 9, "long": 9}, now=0.1) == [short]
    assert short.padding and short.slot is not None and short.block_table  # still computed, still held
    assert step(sched, {"long": 9}, now=0.2) == []
    assert step(sched, {"long": 9}, now=0.3) == [long]
    assert not sched.running and sched.allocator.num_free_blocks == NUM_BLOCKS  # the batch left together
    assert short.slot is None and not short.padding
