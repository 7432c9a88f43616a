"""The bundled workload is paced in a closed loop: a first wave fills the slots, then the trace's arrivals
play at the rate the run completes requests, however the engine's speed changes (core_engine/run/arrival_pacing.py)."""

from __future__ import annotations

import json
import random
import statistics

import pytest
from click.testing import CliRunner

from batchtop.core_engine.engine import control
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.run.arrival_pacing import ClosedLoopPacer
from batchtop.core_engine.sched.request import Request
from batchtop.tui.cli import main
from tests.conftest import tiny_config

TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32"]
SLOTS = 8


class ShiftingClock:
    """Advances `tick` seconds per reading: a step's time is set by the test, and can change mid-run
    (a busy neighbour slowing the host)."""

    def __init__(self, tick: float = 0.02) -> None:  # ~0.14 s a step, as the real model's on a CPU
        self.t = 0.0
        self.tick = tick

    def __call__(self) -> float:
        self.t += self.tick
        return self.t


def trace(n: int = 1200, seed: int = 1) -> list[Request]:
    """A bursty recorded trace: 2 arrivals per recorded second on average, outputs 4-24 tokens."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(2.0) if rng.random() > 0.2 else 0.0  # a fifth come in bursts
        out.append(Request(f"r{i}", tuple(range(1, 2 + rng.randrange(12))), rng.randrange(4, 25), arrival_s=t))
    return out


def paced_engine(mode: str = "continuous") -> tuple[Engine, ClosedLoopPacer, ShiftingClock]:
    clock = ShiftingClock()
    engine = Engine(tiny_config(mode=mode, max_num_seqs=SLOTS, max_num_batched_tokens=128, num_kv_blocks=256),
                    clock=clock)
    pacer = ClosedLoopPacer(first_wave=SLOTS)
    engine.use_feed(pacer)
    engine.load_workload(trace())
    return engine, pacer, clock


def run_steps(engine: Engine, n: int) -> list:
    snaps = []
    for _ in range(n):
        snap = engine.step()
        if snap.is_step:
            snaps.append(snap)
    return snaps


def busy(snaps) -> float:
    return statistics.fmean(s.num_running for s in snaps) / SLOTS


def test_the_first_step_finds_every_slot_taken():
    engine, _, _ = paced_engine()
    first = engine.step()
    assert first.num_running == SLOTS  # the first wave: no sparse start


def test_slots_stay_about_80_percent_busy_while_the_host_slows_and_speeds_up_and_the_queue_stays_bounded():
    engine, pacer, clock = paced_engine()
    warm = run_steps(engine, 150)
    phases = []
    for tick in (0.08, 0.02):  # the host gets 4x slower, then fast again
        clock.tick = tick
        run_steps(engine, 100)  # the controller adapts
        phases.append(run_steps(engine, 250))
    for snaps in phases:
        assert 0.6 <= busy(snaps) <= 0.95, busy(snaps)
        assert max(s.num_waiting for s in snaps) <= SLOTS  # no queue growing without bound
    assert max(s.num_waiting for s in warm) <= SLOTS
    speeds = [s.arrival_speed for s in phases[0] + phases[1]]
    assert all(v is not None and v > 0 for v in speeds)
    assert statistics.fmean(s.arrival_speed for s in phases[1]) > 1.5 * statistics.fmean(s.arrival_speed for s in phases[0])
    assert "played at" in pacer.describe() and pacer.summary()["kind"] == "closed-loop"


def test_the_recorded_arrival_times_are_the_real_ones_not_the_traces():
    engine, _, clock = paced_engine()
    finished = [f for s in run_steps(engine, 400) for f in s.finished]
    assert len(finished) > 40
    recorded = {r.id: r.arrival_s for r in trace()}
    for f in finished:
        assert 0.0 <= f.arrival_s <= f.finish_s <= clock.t  # run time, when it was admitted
    late = [f for f in finished if recorded[f.request_id] > 5.0]
    assert late and any(abs(f.arrival_s - recorded[f.request_id]) > 1.0 for f in late)


def test_static_batching_holds_the_pace_and_falls_behind():
    """Static batching completes fewer requests per second at the same pace: its queue grows where
    continuous batching's does not (the teaching text's point)."""
    engine, pacer, _ = paced_engine()
    run_steps(engine, 250)
    engine.submit(control.SetMode("static"))  # as the `s` key does
    snaps = run_steps(engine, 600)
    assert pacer.held
    assert snaps[-1].num_waiting > SLOTS
    assert all(s.arrival_speed == pytest.approx(snaps[0].arrival_speed) for s in snaps[-50:])


@pytest.mark.parametrize("args,paced", [([], True), (["--time-scale", "0.01"], False)])
def test_the_bundled_workload_is_paced_unless_a_time_scale_is_given(tmp_path, args, paced):
    out = tmp_path / "m.json"
    result = CliRunner().invoke(main, ["--headless", *TINY, "--num-requests", "24", *args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    workload = json.loads(out.read_text())["workload"]
    assert ("pace" in workload) == paced
    if paced:
        assert "closed loop" in result.stderr and workload["pacing"]["kind"] == "closed-loop"
        assert workload["pacing"]["speed_mean"] > 0
    else:
        assert workload["time_scale"] == 0.01


def test_a_run_that_starts_in_static_batching_learns_a_pace_before_it_holds_one():
    """With no pace learned yet there is nothing to hold: the trace must not trickle in one request at a time."""
    engine, pacer, _ = paced_engine("static")
    snaps = run_steps(engine, 400)
    assert snaps[-1].arrival_speed > 0
    batches = [s.num_running for s in snaps[100:] if s.admitted]
    assert max(batches) > 2
