"""What-if mode on the engine: the real scheduler over a simulated runner and a virtual clock."""

from __future__ import annotations

import time

import pytest

from batchtop.core_engine.config import preset
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.run.headless import drive, run_workload
from batchtop.core_engine.run.loop import JumpTime
from batchtop.core_engine.run.live_session import Session
from batchtop.core_engine.run.script import ScriptAction, ScriptPlayer
from batchtop.core_engine.simulate.calibration import DEFAULT, Calibration
from batchtop.core_engine.simulate.clock import VirtualClock
from batchtop.core_engine.simulate.runner import RooflineTimer, SimulatedRunner
from batchtop.core_engine.simulate.simulation import Simulation
from batchtop.core_engine.simulate.simulated_devices import simulated_device
from tests.conftest import FakeClock, make_requests, tiny_config

PEAKS = DevicePeaks("Test GPU", 1e12, 1e11, "datasheet:test")


def staggered(n: int = 24, burst: int = 6) -> list[Request]:
    """Arrivals spread over the run, so which step admits whom depends on the clock; the first `burst`
    arrive together and outgrow the test's 24-block pool alone, so there are preemptions however fast
    this machine runs the steps."""
    return [Request(r.id, r.prompt_token_ids, r.max_tokens, arrival_s=0.004 * max(0, i - burst + 1))
            for i, r in enumerate(make_requests(n, seed=3, prompt=(4, 30), output=(4, 24)))]


def decisions(snaps) -> list[tuple]:
    return [(s.step, s.admitted, s.preempted, tuple(f.request_id for f in s.finished), s.num_seqs, s.num_tokens)
            for s in snaps if s.is_step]


def real_run(config, requests) -> tuple[list, list[float]]:
    """The real engine, its clock moved only by each forward's measured time (and, when idle, to the next
    arrival, as a simulated run's clock is): the clock readings then depend on the step times alone."""
    clock = FakeClock()
    engine = Engine(config, clock=clock)
    forward, times = engine.runner.run, []

    def timed(batch):
        t0 = time.perf_counter()
        out = forward(batch)
        times.append(time.perf_counter() - t0)
        clock.advance(times[-1])
        return out

    engine.runner.run = timed
    snaps = []
    result = run_workload(engine, requests, on_step=snaps.append, time=JumpTime(clock))
    assert result.complete
    return snaps, times


@pytest.mark.parametrize("mode", ["continuous", "static"])
def test_given_the_real_runs_step_times_the_simulation_makes_the_same_decisions(mode):
    config = tiny_config(mode=mode, max_num_seqs=6, max_num_batched_tokens=32, num_kv_blocks=24)
    requests = staggered()
    real, measured = real_run(config, requests)
    replay = iter(measured)
    clock = VirtualClock()
    sim = Engine(config, runner=SimulatedRunner(config, clock, lambda cost: (0.0, next(replay))), clock=clock)
    simulated = []
    assert run_workload(sim, requests, on_step=simulated.append).complete
    assert next(replay, None) is None  # one modelled step per real one
    assert decisions(simulated) == decisions(real)
    assert [s.t for s in simulated if s.is_step] == pytest.approx([s.t for s in real if s.is_step])
    if mode == "continuous":
        assert sum(len(s.preempted) for s in real) > 0, "the workload should exercise preemption"


def test_each_step_takes_the_calibrated_roofline_time_of_the_cost_the_roofline_panel_shows():
    config = tiny_config(max_num_seqs=4, num_kv_blocks=64)
    cal = Calibration(compute_efficiency=0.5, memory_efficiency=0.25, attention_efficiency=0.4, step_overhead_s=0.003)
    engine = Simulation(simulated_device("h200"), PEAKS, cal).engine(config)
    snaps = []
    run_workload(engine, make_requests(8, seed=1), on_step=snaps.append)
    steps = [s for s in snaps if s.is_step]
    assert steps and engine.counters.completed == 8
    flop_rate, bandwidth, kv_rate = 0.5 * PEAKS.peak_flops, 0.25 * PEAKS.peak_bytes_per_s, 0.4 * PEAKS.peak_bytes_per_s
    for s in steps:
        c = s.cost
        device = (max(c.weight_flops / flop_rate, (c.bytes - c.kv_bytes) / bandwidth)  # the GEMMs, then
                  + max(c.attn_flops / flop_rate, c.kv_bytes / kv_rate))  # attention, each at its own roof
        assert s.forward_s == pytest.approx(device) and s.prepare_s == pytest.approx(0.003)
        assert s.step_time_s == pytest.approx(0.003 + device)
    assert snaps[-1].t == pytest.approx(sum(s.step_time_s for s in steps))


def first_full_decode(engine: Engine, batch: int, prompt: int):
    requests = [Request(f"r{i}", tuple(range(1, prompt + 1)), 4) for i in range(batch)]
    snaps = []
    assert run_workload(engine, requests, on_step=snaps.append).complete
    return next(s for s in snaps if s.is_step and s.num_prefill_tokens == 0 and s.num_seqs == batch)


def test_a_longer_context_makes_a_decode_step_slower_by_its_kv_read_at_the_attention_roof_even_when_compute_bound():
    peaks = DevicePeaks("cpu-like", 170e9, 22e9, "measured:test")  # ridge 7.7 FLOP/byte
    cal = Calibration(compute_efficiency=1.0, memory_efficiency=3.0, attention_efficiency=0.6, step_overhead_s=0.001)
    config = tiny_config(model=preset("cpu-demo"), dtype="bfloat16", max_num_seqs=32, max_num_batched_tokens=32 * 1024,
                         block_size=16, num_kv_blocks=4096)
    short, long = (first_full_decode(Simulation(simulated_device("cpu"), peaks, cal).engine(config), 32, prompt)
                   for prompt in (128, 1024))
    assert short.cost.intensity > peaks.ridge_flop_per_byte and long.cost.intensity > peaks.ridge_flop_per_byte
    kv_read = (long.cost.kv_bytes - short.cost.kv_bytes) / (0.6 * peaks.peak_bytes_per_s)
    assert long.forward_s - short.forward_s == pytest.approx(kv_read)  # 32 rows x 896 tokens more: ~18 ms
    assert long.forward_s > 1.3 * short.forward_s


def test_idle_time_is_jumped_not_slept_and_latencies_are_simulated_seconds():
    config = tiny_config(max_num_seqs=2)
    engine = Simulation(simulated_device("h200"), PEAKS, DEFAULT).engine(config)
    requests = [Request("early", (1, 2, 3), 4), Request("late", (4, 5, 6), 4, arrival_s=3600.0)]
    snaps = []
    started = time.perf_counter()
    assert run_workload(engine, requests, on_step=snaps.append).complete
    assert time.perf_counter() - started < 5  # an hour of simulated idle time is not waited for
    late = next(f for s in snaps for f in s.finished if f.request_id == "late")
    first_step = next(s for s in snaps if s.is_step and "late" in s.admitted)
    assert late.arrival_s == 3600.0 and first_step.t - first_step.step_time_s == pytest.approx(3600.0)
    assert late.ttft_s == pytest.approx(first_step.step_time_s)  # admitted at once: TTFT is its prefill step


def test_a_script_action_inside_an_idle_gap_fires_at_its_time():
    config = tiny_config(max_num_seqs=2)
    engine = Simulation(simulated_device("h200"), PEAKS, DEFAULT).engine(config)
    requests = [Request("a", (1, 2), 2), Request("b", (3, 4), 2, arrival_s=100.0)]
    engine.load_workload(requests)
    session = Session(engine, requests, script=ScriptPlayer([ScriptAction(50.0, max_num_seqs=1)]))
    snaps = []
    drive(engine, session, on_step=snaps.append)
    change = next(s for s in snaps if ("max_num_seqs", 1) in s.controls)
    assert change.t == pytest.approx(50.0, abs=1e-6)


def test_the_virtual_clock_makes_progress_on_waits_below_its_resolution():
    clock = VirtualClock(1e9)
    clock.advance(1e-12)
    assert clock() > 1e9
    with pytest.raises(ValueError):
        clock.advance(-1.0)


def test_a_simulated_run_produces_every_requested_token_without_a_model():
    config = tiny_config(mode="static", max_num_seqs=3)
    engine = Simulation(simulated_device("l4"), PEAKS, DEFAULT).engine(config)
    requests = make_requests(7, seed=2)
    snaps = []
    run_workload(engine, requests, on_step=snaps.append)
    done = {f.request_id: f for s in snaps for f in s.finished}
    assert {r.id: r.max_tokens for r in requests} == {k: f.num_generated for k, f in done.items()}
    assert not hasattr(engine.runner, "model")
    assert isinstance(engine.runner.timer, RooflineTimer)


@pytest.mark.parametrize("mode", ["continuous", "static"])
def test_the_simulated_runner_feeds_the_lm_head_and_samples_like_the_real_one(mode):
    config = tiny_config(mode=mode, max_num_seqs=4, max_num_batched_tokens=16)
    engine = Engine(config)
    simulated = SimulatedRunner(config, VirtualClock(), lambda cost: (0.0, 0.0))
    prepare, seen = engine.runner.prepare, []

    def both(plan):
        real = prepare(plan)
        sim = simulated.prepare(plan)
        assert len(sim.logits_rows) == len(real.logits_rows)
        assert list(sim.sampled) == real.sampled_seqs
        seen.append(len(plan.padding))
        return real

    engine.runner.prepare = both
    run_workload(engine, make_requests(10, seed=4, output=(1, 12)))
    assert seen and (mode == "continuous" or max(seen) > 0)  # static batching computed padding rows
