"""Numbers that are finite but absurd (issue 29, round 2): a calibration constant of 1e-320 or 1e308, a
trace step of 1e308 seconds, an arrival 1e308 s away. Each is refused by name (exit 2) before any
work, and whatever still reaches the engine ends a run with an error instead of a clock stuck at
infinity, a loop that never ends or metrics that cannot be written."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from click.testing import CliRunner

from batchtop.core_engine.engine.arrivals import ArrivalQueue
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.run import resolve
from batchtop.core_engine.run.resolve import resolve_config
from batchtop.core_engine.run.headless import run_workload
from batchtop.core_engine.run import arrival_pacing
from batchtop.core_engine.simulate.calibration import Calibration
from batchtop.core_engine.simulate.clock import VirtualClock
from batchtop.core_engine.simulate.simulated_devices import simulated_device
from batchtop.core_engine.simulate.simulation import Simulation
from batchtop.tui.cli import main
from tests.conftest import make_requests, run_all, tiny_config
from tests.support.deadline import returns_within
from tests.support.exits import assert_exit_2

TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32"]
PEAKS = DevicePeaks("Test GPU", 1e12, 1e11, "datasheet:test")
GOOD = {"compute_efficiency": 0.6, "memory_efficiency": 0.8, "attention_efficiency": 0.8, "step_overhead_s": 0.002}


def invoke(args):
    return CliRunner().invoke(main, args)


# -- 3: calibration constants bounded, the virtual clock unable to reach infinity ---------------------

@pytest.mark.parametrize("constants,says", ids=["compute-tiny", "attention-huge", "overhead-huge"], argvalues=[
    ({"compute_efficiency": 1e-320}, "compute_efficiency must be in 0.01..100 (a share of the device's peak), "
                                     "got 1e-320"),
    ({"attention_efficiency": 1e6}, "attention_efficiency must be in 0.01..100"),
    ({"step_overhead_s": 1e308}, "step_overhead_s must be at most 3600 s a step, got 1e+308"),
])
def test_a_calibration_constant_out_of_its_physical_range_exits_2_naming_file_and_key(tmp_path, constants, says):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({**GOOD, **constants}))
    result = invoke(["--headless", "--simulate", "h200", *TINY[:2], "--num-requests", "4", "--time-scale", "0",
                     "--num-kv-blocks", "64", "--calibration", str(path), "-o", str(tmp_path / "m.json")])
    assert_exit_2(result, f"--calibration: {path}: {says}")
    assert not (tmp_path / "m.json").exists()


def test_the_virtual_clock_refuses_an_infinite_step_and_an_overflow():
    clock = VirtualClock()
    for bad in (math.inf, math.nan, -1.0):
        with pytest.raises(ValueError):
            clock.advance(bad)
    clock = VirtualClock(1.5e308)
    with pytest.raises(ValueError, match="overflowed"):
        clock.advance(1e308)
    assert clock() == 1.5e308


def test_a_step_of_infinite_modelled_time_ends_the_run_with_an_error_and_writable_metrics():
    """A calibration that slips past the file checks (built in code) makes a step take inf seconds:
    the run ends as an engine failure, at once, and its metrics are strict JSON."""
    absurd = Calibration(compute_efficiency=1e-320, memory_efficiency=1e-320, attention_efficiency=1e-320,
                         step_overhead_s=0.001)
    engine = Simulation(simulated_device("h200"), PEAKS, absurd).engine(tiny_config())
    result = returns_within(60, lambda: run_workload(engine, make_requests(6, seed=1)))
    assert isinstance(result.error, ValueError) and "finite" in str(result.error)
    assert not result.complete
    json.dumps(result.collector.summary(engine.config.as_dict(), complete=False, peaks=PEAKS), allow_nan=False)


def test_arrival_times_that_are_not_finite_are_refused_before_they_can_stall_an_idle_loop():
    queue = ArrivalQueue()
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="not a finite number"):
            queue.push([Request("r", (1, 2), 2, arrival_s=bad)], 0.0)
    assert len(queue) == 0


def test_a_clock_that_does_not_advance_gives_the_closed_loop_pace_no_infinite_speed():
    """The pacer divides completions by run time: steps that take no time (a coarse clock) must not give
    an infinite or NaN pace, and the workload still plays to its end."""
    engine = Engine(tiny_config(max_num_seqs=2), clock=lambda: 0.0)
    pacer = arrival_pacing.ClosedLoopPacer(first_wave=2)
    engine.use_feed(pacer)
    engine.load_workload([Request(f"r{i}", (1, 2, 3), 4, arrival_s=float(i)) for i in range(8)])
    for _ in range(400):
        if engine.is_done():
            break
        snap = engine.step()
        assert snap.arrival_speed is None or math.isfinite(snap.arrival_speed)
    assert engine.is_done() and engine.counters.completed == 8


# -- 7: metrics never hold a NaN or an infinity -----------------------------------------------------

def test_the_metrics_document_replaces_non_finite_values_with_null():
    _, snaps, collector = run_all(Engine(tiny_config()), make_requests(3, seed=2))
    collector.observe(dataclasses.replace(snaps[-1], step_time_s=math.inf, forward_s=math.nan, t=math.inf))
    config = {**tiny_config().as_dict(), "model": {**tiny_config().model.as_dict(), "rope_theta": math.nan}}
    doc = collector.summary(config, peaks=PEAKS)
    text = json.dumps(doc, allow_nan=False)  # raised "Out of range float values" before
    assert json.loads(text)["config"]["model"]["rope_theta"] is None


# -- 10: a memory-sized pool stops at what the engine can ever use ----------------------------------

def test_a_small_model_on_a_large_simulated_gpu_gets_the_pool_it_can_use_and_the_note_says_so():
    config = resolve_config(simulate=simulated_device("h200"), model="tiny")
    most = resolve.kv_blocks_ever_used(config.model, 16, config.max_num_batched_tokens)
    assert most == 2048 * (4096 // 16) and config.num_kv_blocks == most  # was 32.7M blocks, 48 s to build
    assert "KV pool capped at 524288 blocks" in resolve.pool_note(config) and "32733525" in resolve.pool_note(config)
    big = resolve_config(simulate=simulated_device("h200"), model="gpu-8b")
    assert big.num_kv_blocks == 52282 and resolve.pool_note(big) is None  # memory, not the cap, limits it
    explicit = resolve_config(simulate=simulated_device("h200"), model="tiny", num_kv_blocks=600000)
    assert explicit.num_kv_blocks == 600000 and resolve.pool_note(explicit) is None  # what the user asked for


def test_the_startup_note_names_the_capped_pool(tmp_path):
    result = invoke(["--headless", "--simulate", "h200", "--model", "tiny", "--num-requests", "4", "--time-scale",
                     "0", "-o", str(tmp_path / "m.json")])
    assert result.exit_code == 0, result.output
    assert "KV pool capped at 524288 blocks" in result.stderr
    assert json.loads((tmp_path / "m.json").read_text())["kv"]["num_blocks"] == 524288


# -- workloads: arrivals no run could wait for -------------------------------------------------------
# (simulated, so that without the checks the run jumps to the arrival and the test fails fast instead of
# waiting 1e308 seconds for it)
SIM = ["--simulate", "h200", "--model", "tiny", "--num-kv-blocks", "64"]

def test_an_arrival_past_the_latest_a_workload_may_ask_for_exits_2_naming_its_line(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt_len": 4, "max_tokens": 2}\n{"prompt_len": 4, "max_tokens": 2, "arrival_s": 1e308}\n')
    assert_exit_2(invoke(["--headless", *SIM, "--workload", str(path)]), f"{path}:2: arrival_s must be a number",
                  "at most 1e+09")


def test_a_time_scale_or_rate_that_pushes_arrivals_out_of_reach_is_refused_by_name(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt_len": 4, "max_tokens": 2}\n{"prompt_len": 4, "max_tokens": 2, "arrival_s": 10}\n')
    assert_exit_2(invoke(["--headless", *SIM, "--workload", str(path), "--time-scale", "1e300"]),
                  "--time-scale: 1e+300: request 'line2' would arrive 1e+301 s after the start")
    assert_exit_2(invoke(["--headless", *SIM, "--workload", "synthetic", "--num-requests", "3", "--rate", "1e-300"]),
                  "--rate: 1e-300 arrivals per second")


def test_a_script_action_out_of_reach_exits_2_naming_the_action(tmp_path):
    script = tmp_path / "s.json"
    script.write_text('[{"at": 0, "caption": "hi"}, {"at": 1e308, "quit": true}]')
    assert_exit_2(invoke(["--headless", *SIM, "--workload", "synthetic", "--num-requests", "2", "--script",
                          str(script)]), f"{script}: action 2: 'at' must be at most 1e+09 seconds, got 1e+308")


def test_a_recording_whose_config_holds_nan_still_opens_and_reads_back(tmp_path):
    """A model config value read as NaN (rope_theta) failed the trace's header write: an empty file and
    a traceback before the first step."""
    from batchtop.core_engine.trace.trace import Recorder, read_trace

    config = {**tiny_config().as_dict(), "model": {**tiny_config().model.as_dict(), "rope_theta": math.nan}}
    path = tmp_path / "t.jsonl"
    recorder = Recorder(str(path), {"config": config, "peaks": None})
    recorder.close("finished")
    trace = read_trace(str(path))
    assert trace.header["config"]["model"]["rope_theta"] is None and trace.ended_cleanly
