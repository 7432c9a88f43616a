"""Static batching as generate() does it: one unit, prompts left-padded, one prefill step, lockstep
decode, finished rows computed to the end, the whole request's KV reserved up front."""

from __future__ import annotations

import pytest

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Phase, Request
from batchtop.core_engine.sched.wait_reason import WaitKind
from tests.conftest import FakeClock, run_all, tiny_config


def timed(engine: Engine, clock: FakeClock, seconds: float = 0.1) -> Engine:
    real_run = engine.runner.run

    def run(batch):
        clock.advance(seconds)  # every forward takes `seconds`
        return real_run(batch)

    engine.runner.run = run
    return engine


def test_a_static_batch_is_prefilled_in_one_step_with_prompts_left_padded_to_the_longest():
    reqs = [Request("a", (1,) * 3, 2), Request("b", (2,) * 7, 5), Request("c", (3,) * 5, 3)]
    engine = Engine(tiny_config(mode="static", max_num_seqs=4, max_num_batched_tokens=4))
    lm_head_rows, forward_tokens = [], []
    engine.runner.model.lm_head.register_forward_hook(lambda m, args, out: lm_head_rows.append(out.shape[0]))
    engine.runner.model.model.embed_tokens.register_forward_hook(lambda m, args, out: forward_tokens.append(out.shape[0]))
    _, snaps, metrics = run_all(engine, reqs)
    first = snaps[0]
    assert set(first.admitted) == {"a", "b", "c"}  # one unit, whatever the token budget (4 here)
    assert first.num_prefill_tokens == 15 and first.num_prompt_padding_tokens == 4 + 2
    assert {s.request_id: s.num_prompt_padding for s in first.slots if s.request_id} == {"a": 4, "b": 0, "c": 2}
    assert first.counters.generated_tokens == 3  # every member's first token comes from that one step
    # then lockstep: every later step has one row per member, finished ones as padding, until b ends
    assert [s.num_seqs for s in snaps[1:]] == [3, 3, 3, 3] and len(snaps) == 5
    assert [s.num_padding_tokens for s in snaps[1:]] == [0, 1, 2, 2]
    # the 21-token padded prefill is one step of the schedule, run as forwards of at most 4 tokens
    assert forward_tokens == [4, 4, 4, 4, 4, 1, 3, 3, 3, 3] and sum(lm_head_rows[:6]) == 3
    assert lm_head_rows[6:] == [3, 3, 3, 3]
    c = engine.counters
    assert c.prompt_tokens == 15 and c.prompt_padding_tokens == 6
    assert c.computed_tokens == 15 + 6 + 4 * 3  # prompts, their padding, and every lockstep row
    summary = metrics.summary({})
    assert summary["tokens"]["prompt_padding"] == 6
    assert summary["prompt_padding_share"] == pytest.approx(6 / c.computed_tokens)


def test_a_static_members_time_to_first_token_is_its_batchs_prefill():
    clock = FakeClock()
    engine = timed(Engine(tiny_config(mode="static", max_num_seqs=2), clock=clock), clock)
    reqs = [Request("short", (1,) * 2, 1), Request("long", (2,) * 20, 3), Request("next", (3,) * 2, 2)]
    _, _, metrics = run_all(engine, reqs)
    ttft = {f.request_id: f.ttft_s for f in metrics.finished}
    assert ttft["short"] == pytest.approx(0.1) and ttft["long"] == pytest.approx(0.1)
    # "next" waits for the whole first batch (prefill + 2 lockstep steps), then its own prefill
    assert ttft["next"] == pytest.approx(0.4)


def test_finished_rows_are_computed_every_step_whatever_the_token_budget():
    # the smallest budget allowed (one decode per slot): the 12-token batch prefill still runs as one step
    engine = Engine(tiny_config(mode="static", max_num_seqs=3, max_num_batched_tokens=3))
    reqs = [Request("a", (1,) * 4, 1), Request("b", (2,) * 4, 1), Request("c", (3,) * 4, 6)]
    _, snaps, metrics = run_all(engine, reqs)
    assert len(snaps) == 6
    assert [s.num_padding_tokens for s in snaps] == [0, 2, 2, 2, 2, 2]
    # the slots as each step leaves them: a and b finish in the prefill and stay on as padding; the batch
    # ends with c's last token and all three are released (finished) in that step
    assert [sum(v.phase is Phase.PADDING for v in s.slots) for s in snaps] == [2, 2, 2, 2, 2, 0]
    assert [v.phase for v in snaps[-1].slots] == [Phase.FINISHED] * 3
    summary = metrics.summary({})
    computed = summary["tokens"]["computed"]
    assert computed == 12 + 5 + 10  # prompts, c's decodes, and the two padding rows of every decode step
    assert summary["padding_share"] == pytest.approx(10 / (6 * 3))  # from rows computed: 10 of 18 slot-steps


def test_a_static_batch_reserves_whole_requests_admits_fewer_when_the_pool_is_short_and_never_preempts():
    # each request needs (8 + 12 - 1) / 4 -> 5 blocks for its whole life; 12 blocks hold two
    reqs = [Request(f"r{i}", (i + 1,) * 8, 12) for i in range(4)]
    engine = Engine(tiny_config(mode="static", max_num_seqs=4, num_kv_blocks=12))
    _, snaps, _ = run_all(engine, reqs)
    first = snaps[0]
    assert first.admitted == ("r0", "r1") and first.num_used_blocks == 10
    assert first.slot_states() == ("working", "working", "bubble", "bubble")  # slots KV cannot fill
    reason = first.wait_reason
    assert reason.kind is WaitKind.KV_FULL and "limited to 2" in reason.message and "needs 5 blocks" in reason.message
    assert [s.num_used_blocks for s in snaps[:11]] == [10] * 11  # reserved up front: the batch never grows
    assert snaps[11].finished and snaps[12].admitted == ("r2", "r3")
    assert engine.counters.preemptions == 0 and engine.counters.completed == 4
    later = next(s for s in snaps[1:] if s.num_waiting)
    assert later.wait_reason.kind is WaitKind.STATIC_BATCH


def test_static_and_continuous_produce_the_same_tokens_despite_the_padding():
    reqs = [Request(f"p{i}", tuple(range(1, 2 + 5 * i)), 4 + i) for i in range(6)]
    static = Engine(tiny_config(mode="static", max_num_seqs=3))
    cont = Engine(tiny_config(mode="continuous", max_num_seqs=3), runner=static.runner)
    out_static, snaps, _ = run_all(static, reqs)
    out_cont, _, _ = run_all(cont, reqs)
    assert sum(s.num_prompt_padding_tokens for s in snaps) > 0
    assert out_static == out_cont
