"""Metrics come from what happened: percentiles, utilisation, bubbles and padding."""

from __future__ import annotations

import pytest

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.perf.metrics import RateWindow, percentiles
from batchtop.core_engine.sched.request import Request
from tests.conftest import FakeClock, make_requests, run_all, tiny_config


def test_percentiles_interpolate_like_numpy():
    p = percentiles([1.0, 2.0, 3.0, 4.0, 10.0])
    assert p["p50"] == 3.0 and p["p90"] == pytest.approx(7.6) and p["mean"] == 4.0
    assert percentiles([])["p50"] is None


def test_latencies_follow_the_clock():
    clock = FakeClock()
    engine = Engine(tiny_config(max_num_seqs=1), clock=clock)
    engine.load_workload([Request("a", (1, 2, 3), 3), Request("b", (4, 5), 2, arrival_s=0.5)])
    real_run = engine.runner.run

    def timed_run(batch):
        clock.advance(0.1)  # every forward takes 100 ms
        return real_run(batch)

    engine.runner.run = timed_run
    _, snaps, metrics = run_all(engine, on_idle=lambda e: clock.advance(e.seconds_until_next_arrival()))
    done = {f.request_id: f for f in metrics.finished}
    assert done["a"].ttft_s == pytest.approx(0.1) and done["a"].e2e_s == pytest.approx(0.3)
    assert done["a"].tpot_s == pytest.approx(0.1)
    # the engine idles from 0.3 s until b arrives at 0.5 s; b's latency counts from its arrival
    assert done["b"].ttft_s == pytest.approx(0.1)
    summary = metrics.summary({"block_size": 4})
    assert summary["wall_time_s"] == pytest.approx(snaps[-1].t)
    assert summary["steps"] == 5


def test_static_batching_shows_bubbles_and_padding_that_continuous_does_not():
    reqs = make_requests(16, seed=9, prompt=(2, 6), output=(1, 24))
    static = Engine(tiny_config(mode="static"))
    cont = Engine(tiny_config(), runner=static.runner)
    ms = run_all(static, reqs)[2].summary({"block_size": 4})
    mc = run_all(cont, reqs)[2].summary({"block_size": 4})
    assert ms["padding_share"] > 0.1 and mc["padding_share"] == 0
    assert mc["slot_utilization"] > ms["slot_utilization"]
    assert ms["steps"] > mc["steps"]
    assert mc["tokens"]["generated"] == ms["tokens"]["generated"]
    assert ms["tokens"]["computed"] > mc["tokens"]["computed"]
    assert ms["kv"]["free_blocks_at_end"] == ms["kv"]["num_blocks"] == 64


def test_bubbles_count_idle_slots_only_while_requests_wait():
    # one slot of two is idle for the whole run, but nobody waits: no bubble
    engine = Engine(tiny_config(max_num_seqs=2))
    m = run_all(engine, [Request("solo", (1, 2), 6)])[2].summary({})
    assert m["bubble_share"] == 0 and m["slot_utilization"] == pytest.approx(0.5)


def test_rate_window_measures_recent_tokens_per_second():
    w = RateWindow(seconds=1.0)
    for i in range(11):
        w.add(i * 0.1, 5)
    assert w.rate() == pytest.approx(50.0)


def test_time_spent_before_the_first_step_is_not_charged_to_the_run():
    clock = FakeClock()
    engine = Engine(tiny_config(), clock=clock)
    engine.load_workload([Request("a", (1, 2, 3), 2), Request("b", (4, 5), 2, arrival_s=0.25)])
    clock.advance(4.0)  # building the dashboard, measuring device peaks, loading the trace...
    _, _, metrics = run_all(engine, on_idle=lambda e: clock.advance(e.seconds_until_next_arrival()))
    done = {f.request_id: f for f in metrics.finished}
    assert done["a"].ttft_s == 0.0 and done["b"].arrival_s == 0.25
    assert metrics.summary(engine.config.as_dict())["wall_time_s"] == 0.25


def test_slot_shares_stay_within_one_when_max_num_seqs_is_lowered_under_running_sequences():
    from batchtop.core_engine.engine import control

    engine = Engine(tiny_config(max_num_seqs=8, max_num_batched_tokens=256, num_kv_blocks=256))

    def lower_after_admission(e, snap):
        if snap.counters.steps == 1:
            e.submit(control.SetMaxNumSeqs(1))

    _, snaps, metrics = run_all(engine, make_requests(12, seed=4, output=(10, 16)), check=lower_after_admission)
    assert max(len(s.slots) for s in snaps) == 8 and snaps[-1].max_num_seqs == 1
    s = metrics.summary(engine.config.as_dict())
    assert 0 < s["slot_utilization"] <= 1
    assert s["slot_utilization"] + s["bubble_share"] + s["padding_share"] <= 1 + 1e-9


@pytest.mark.parametrize("mode", ["static", "continuous"])
def test_slot_state_shares_sum_to_one_and_agree_with_the_step_by_step_picture(mode):
    reqs = make_requests(12, seed=11, prompt=(2, 10), output=(1, 20))
    engine = Engine(tiny_config(mode=mode, max_num_seqs=3))
    _, snaps, metrics = run_all(engine, reqs)
    m = metrics.summary({})
    shares = [m["slot_utilization"], m["padding_share"], m["bubble_share"], m["free_share"]]
    assert sum(shares) == pytest.approx(1.0)
    states = [state for s in snaps for state in s.slot_states()]
    assert m["padding_share"] == pytest.approx(states.count("padding") / len(states))
    assert m["bubble_share"] == pytest.approx(states.count("bubble") / len(states))
    if mode == "static":
        assert m["padding_share"] > 0 and m["prompt_padding_share"] > 0
    else:
        assert m["padding_share"] == 0 and m["prompt_padding_share"] == 0
