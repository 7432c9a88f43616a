"""Scheduling behaviour a user would notice: budgets, refills, static batches, preemption, rejection."""

from __future__ import annotations

from batchtop.core_engine.engine import control
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Phase, Request, SamplingParams
from tests.conftest import make_requests, run_all, tiny_config


def check_step(engine: Engine, snap) -> None:
    """I2-I4 after every step, plus the per-step budgets (I3; a static step has none, as generate())."""
    engine.scheduler.check_invariants()
    if not snap.is_step:
        return
    if snap.mode == "continuous":
        assert snap.num_tokens <= snap.max_num_batched_tokens
    occupied = [s for s in snap.slots if s.phase is not Phase.EMPTY]
    assert len(occupied) <= max(snap.max_num_seqs, len(occupied))
    assert len({s.request_id for s in occupied}) == len(occupied)


def assert_drained(engine: Engine) -> None:
    """I1: nothing is left after a drain."""
    sched = engine.scheduler
    assert not sched.waiting and not sched.running
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks
    assert all(engine.allocator.ref_count(b) == 0 for b in range(engine.allocator.num_blocks))


def test_every_request_finishes_with_exactly_max_tokens_and_nothing_leaks():
    reqs = make_requests(12)
    engine = Engine(tiny_config())
    outputs, snaps, _ = run_all(engine, reqs, check=check_step)
    assert {r.id: r.max_tokens for r in reqs} == {k: len(v) for k, v in outputs.items()}
    assert all(len(s.slots) == 4 for s in snaps)
    assert_drained(engine)


def test_continuous_refills_a_freed_slot_at_the_very_next_step():
    reqs = [Request("short", (1, 2, 3), 2), Request("long", (4, 5, 6), 12), Request("late", (7, 8), 3)]
    engine = Engine(tiny_config(max_num_seqs=2))
    _, snaps, _ = run_all(engine, reqs)
    finish_step = next(s.step for s in snaps if any(f.request_id == "short" for f in s.finished))
    nxt = next(s for s in snaps if s.step == finish_step + 1)
    assert "late" in nxt.admitted
    assert {v.request_id for v in nxt.slots} == {"long", "late"}


def test_static_batch_admits_nobody_mid_batch_and_computes_padding_rows():
    reqs = [Request("a", (1, 2), 2), Request("b", (3, 4), 10), Request("c", (5, 6), 2)]
    engine = Engine(tiny_config(mode="static", max_num_seqs=2))
    lm_head_rows = []  # like generate(), a padding row is computed through the lm_head too
    engine.runner.model.lm_head.register_forward_hook(lambda m, args, out: lm_head_rows.append(out.shape[0]))
    outputs, snaps, _ = run_all(engine, reqs, check=check_step)
    assert lm_head_rows == [s.num_seqs if not s.num_prefill_tokens else len(s.admitted) for s in snaps]
    c_admitted = next(s.step for s in snaps if "c" in s.admitted)
    b_finished = next(s.step for s in snaps if any(f.request_id == "b" for f in s.finished))
    assert c_admitted == b_finished + 1  # the queue waited for the whole batch
    a_finished = next(s.step for s in snaps if any(f.request_id == "a" for f in s.finished))
    padding_steps = [s for s in snaps if a_finished < s.step <= b_finished]
    assert padding_steps and all(s.num_padding_tokens == 1 for s in padding_steps)
    # a holds its slot (and KV) as padding from the step it finished in until the batch ends, when the
    # whole batch is released: then both members show finished, their blocks free in the same snapshot
    held = [s for s in snaps if a_finished <= s.step < b_finished]
    assert all(any(v.request_id == "a" and v.phase is Phase.PADDING for v in s.slots) for s in held)
    end = next(s for s in snaps if s.step == b_finished)
    assert [v.phase for v in end.slots] == [Phase.FINISHED, Phase.FINISHED] and end.num_used_blocks == 0
    c = engine.counters
    assert c.computed_tokens == c.prompt_tokens + c.generated_tokens - 3 + len(padding_steps)
    assert_drained(engine)


def test_continuous_never_computes_padding_and_both_modes_produce_identical_tokens():
    reqs = make_requests(10, seed=3)
    static = Engine(tiny_config(mode="static"))
    cont = Engine(tiny_config(mode="continuous"), runner=static.runner)
    out_static, snaps_static, _ = run_all(static, reqs, check=check_step)
    out_cont, snaps_cont, _ = run_all(cont, reqs, check=check_step)
    assert out_static == out_cont
    assert all(s.num_padding_tokens == 0 for s in snaps_cont)
    assert sum(s.num_padding_tokens for s in snaps_static) > 0
    # continuous computes exactly prompt + generated - 1 per request (the last token is never fed)
    c = cont.counters
    assert c.computed_tokens == c.prompt_tokens + c.generated_tokens - len(reqs)
    assert static.counters.computed_tokens > c.computed_tokens
    assert len(snaps_cont) < len(snaps_static)


def test_preemption_by_recompute_when_the_pool_runs_dry_still_finishes_everyone_correctly():
    reqs = make_requests(8, seed=5, prompt=(8, 16), output=(10, 20))
    roomy = Engine(tiny_config())
    tight = Engine(tiny_config(num_kv_blocks=16), runner=None)
    expected, _, _ = run_all(roomy, reqs)
    got, snaps, metrics = run_all(tight, reqs, check=check_step)
    assert tight.counters.preemptions > 0
    assert got == expected
    preempted = {rid for s in snaps for rid in s.preempted}
    # the victim is the newest running request, and it goes back to the head of the queue
    first = next(s for s in snaps if s.preempted)
    assert first.waiting[0].request_id == first.preempted[-1]
    assert preempted
    assert_drained(tight)


def test_the_newest_running_request_is_preempted_first():
    reqs = [Request("old", (1,) * 8, 12), Request("new", (2,) * 8, 12)]
    engine = Engine(tiny_config(num_kv_blocks=6, max_num_seqs=2))
    _, snaps, _ = run_all(engine, reqs, check=check_step)
    first = next(s for s in snaps if s.preempted)
    assert first.preempted == ("new",)


def test_chunked_prefill_takes_min_of_remaining_and_budget_and_samples_only_at_the_end():
    engine = Engine(tiny_config(max_num_batched_tokens=8))
    engine.load_workload([Request("long", tuple(range(1, 21)), 2)])
    chunks = []
    while not engine.is_done():
        snap = engine.step()
        chunks.append(snap.num_prefill_tokens)
        if snap.num_prefill_tokens and sum(chunks) < 20:
            assert snap.counters.generated_tokens == 0  # no token from a partial prefill
    assert chunks[:3] == [8, 8, 4]


def test_lowering_max_num_seqs_drops_nobody_and_stops_admissions_until_below_the_cap():
    reqs = make_requests(10, seed=1, output=(6, 12))
    engine = Engine(tiny_config(max_num_seqs=4))
    engine.load_workload(reqs)
    for _ in range(3):
        engine.step()
    assert len(engine.scheduler.running) == 4
    engine.submit(control.SetMaxNumSeqs(2))
    snap = engine.step()
    finished_now = {f.request_id for f in snap.finished}
    assert len(engine.scheduler.running) == 4 - len(finished_now)  # nobody dropped
    assert snap.max_num_seqs == 2 and len(snap.slots) == 4  # the grid still shows the old occupants
    while not engine.is_done():
        snap = engine.step()
        check_step(engine, snap)
        if snap.admitted:
            assert len(engine.scheduler.running) <= 2  # admitted only once below the new cap
    assert engine.counters.completed == 10


def test_switching_mode_mid_run_loses_no_request():
    reqs = make_requests(14, seed=2)
    engine = Engine(tiny_config(mode="continuous"))
    engine.load_workload(reqs)
    steps = 0
    outputs = {}
    while not engine.is_done():
        steps += 1
        if steps % 7 == 0:
            engine.submit(control.SetMode("static" if engine.mode == "continuous" else "continuous"))
        snap = engine.step()
        check_step(engine, snap)
        if snap:
            outputs.update({f.request_id: f.output_token_ids for f in snap.finished})
    assert {r.id: r.max_tokens for r in reqs} == {k: len(v) for k, v in outputs.items()}
    assert_drained(engine)


def test_switching_to_continuous_releases_static_padding_at_the_next_step():
    reqs = [Request("a", (1, 2), 1), Request("b", (3, 4), 20), Request("c", (5,), 2)]
    engine = Engine(tiny_config(mode="static", max_num_seqs=2))
    engine.load_workload(reqs)
    for _ in range(3):
        snap = engine.step()
    assert any(v.phase is Phase.PADDING for v in snap.slots) and snap.num_waiting == 1
    engine.submit(control.SetMode("continuous"))
    snap = engine.step()
    assert snap.admitted == ("c",)
    assert snap.num_padding_tokens == 0


def test_a_request_that_can_never_fit_or_is_malformed_is_rejected_alone_and_the_rest_complete():
    big = Request("big", (1,) * 40, 40)  # 79 KV tokens > 16 blocks x 4 tokens
    nan = Request("nan", (1, 2), 3, sampling=SamplingParams(temperature=float("nan")))
    reqs = [*make_requests(5, seed=4, prompt=(2, 8), output=(2, 8)), big, nan]
    engine = Engine(tiny_config(num_kv_blocks=16))
    outputs, snaps, _ = run_all(engine, reqs, check=check_step)
    rejected = dict(r for s in snaps for r in s.rejected)
    assert "needs 20 KV blocks" in rejected["big"] and "pool has 16" in rejected["big"]
    assert "temperature must be >= 0" in rejected["nan"]
    assert engine.counters.rejected == 2 and engine.counters.completed == 5
    assert "big" not in outputs and "nan" not in outputs
    assert_drained(engine)


def test_abort_of_unknown_or_finished_ids_does_nothing_and_abort_of_a_running_one_frees_its_blocks():
    engine = Engine(tiny_config())
    engine.load_workload([Request("a", (1, 2, 3), 2), Request("b", (1,) * 10, 30)])
    engine.step()
    engine.step()
    engine.apply(control.Abort("nope"))
    engine.apply(control.Abort("a"))  # already finished
    used = engine.allocator.num_used_blocks
    engine.apply(control.Abort("b"))
    assert engine.allocator.num_used_blocks < used
    engine.scheduler.check_invariants()
    assert_drained(engine)


def test_abort_right_after_add_drops_the_request_before_it_arrives_and_only_real_aborts_are_recorded():
    # A client that disconnects at once: its AddRequests and its Abort are applied in the same step.
    engine = Engine(tiny_config())
    engine.submit(control.AddRequests((Request("gone", (1, 2, 3), 20),)))
    engine.submit(control.Abort("gone"))
    engine.submit(control.Abort("never-seen"))
    snap = engine.step()
    assert snap.controls == (("burst", 1), ("abort", "gone"))
    assert not snap.arrived and engine.is_done() and engine.counters.submitted == 0
    assert_drained(engine)


def test_requests_added_with_a_receipt_time_count_their_wait_from_it_under_their_source_label(clock):
    # A server hands requests over between steps: the time they waited for the step to end is
    # part of their queue time and TTFT, as a client sees it.
    engine = Engine(tiny_config(), clock=clock)
    engine.load_workload([Request("w", (1, 2), 50)])
    engine.step()
    received = engine.now()
    clock.advance(0.25)  # the step in flight when the request came
    engine.submit(control.AddRequests((Request("c", (1, 2, 3), 2),), source="http", arrival_s=received))
    snap = engine.step()
    assert ("http", 1) in snap.controls
    assert [(a.request_id, a.arrival_s) for a in snap.arrived] == [("c", received)]


def test_each_step_carries_the_tokens_it_sampled_and_together_they_are_every_output():
    engine = Engine(tiny_config(num_kv_blocks=16))  # a small pool: preempted sequences keep their tokens
    outputs, snaps, _ = run_all(engine, make_requests(8, seed=5, prompt=(8, 16), output=(10, 20)))
    streamed: dict[str, list[int]] = {}
    generated = 0
    for snap in snaps:
        assert len(snap.new_tokens) == snap.counters.generated_tokens - generated
        generated = snap.counters.generated_tokens
        for rid, token in snap.new_tokens:
            streamed.setdefault(rid, []).append(token)
    assert any(s.preempted for s in snaps)
    assert {rid: tuple(t) for rid, t in streamed.items()} == outputs
