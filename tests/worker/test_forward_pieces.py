"""No forward exceeds max_num_batched_tokens: a static batch's padded prefill runs as pieces within it."""

from __future__ import annotations

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched import SchedulerOutput
from batchtop.core_engine.sched.request import Request, Sequence
from batchtop.core_engine.worker.forward_pieces import split_to_budget
from tests.conftest import make_requests, run_all, tiny_config


def _prefill(prompt: int, index: int = 0) -> Sequence:
    return Sequence(Request(f"s{index}", (1,) * prompt, 4), index, 0.0)


def test_a_plan_over_the_budget_splits_in_order_with_continuation_chunks():
    a, b = _prefill(10, 0), _prefill(3, 1)
    plan = SchedulerOutput(scheduled=[(a, 10), (b, 3)], prompt_padding=[(b, 7)])
    pieces = split_to_budget(plan, 4)
    assert [p.num_tokens for p in pieces] == [4, 4, 4, 4, 4]
    runs = [(seq.id, start, n) for p in pieces for seq, start, n in p.prefills]
    assert runs == [("s0", 0, 4), ("s0", 4, 4), ("s0", 8, 2), ("s1", 0, 2), ("s1", 2, 1)]
    assert sum(n for p in pieces for n in p.prompt_padding) == 7


def test_a_plan_within_the_budget_is_one_forward():
    a, b = _prefill(3, 0), _prefill(5, 1)
    pieces = split_to_budget(SchedulerOutput(scheduled=[(a, 3), (b, 5)], prompt_padding=[(a, 2)]), 16)
    assert len(pieces) == 1 and pieces[0].num_tokens == 10


def test_a_static_batch_over_the_budget_never_runs_a_forward_above_it_and_gives_the_same_tokens():
    requests = make_requests(4, seed=3, prompt=(18, 30), output=(3, 6))
    engine = Engine(tiny_config(mode="static", max_num_seqs=4, max_num_batched_tokens=16))
    sizes = []
    engine.runner.model.model.embed_tokens.register_forward_hook(lambda m, args, out: sizes.append(out.shape[0]))
    static, snaps, _ = run_all(engine, requests)
    first = snaps[0]
    assert first.num_prefill_tokens + first.num_prompt_padding_tokens > 16 * 4  # one planned step, far over
    assert max(sizes) <= 16
    reference, _, _ = run_all(Engine(tiny_config(mode="continuous", max_num_seqs=4, max_num_batched_tokens=128)),
                              requests)
    assert static == reference
