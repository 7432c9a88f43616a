"""The what-if model's constants: fitted by least squares, read from files that are checked."""

from __future__ import annotations

import dataclasses
import json

import pytest

from batchtop.core_engine.config import preset
from batchtop.core_engine.model.cost import StepCost
from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.model.cost import Chunk, step_cost
from batchtop.core_engine.simulate.calibration import DEFAULT, Calibration, load_calibration
from batchtop.core_engine.simulate.calibration_fit import fit_calibration, predict
from batchtop.core_engine.perf.decode_sweep import StepSample, sweep_means
from batchtop.core_engine.run.headless import run_workload
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.simulate.simulated_devices import simulated_device
from batchtop.core_engine.simulate.simulation import Simulation
from tests.conftest import tiny_config

PEAKS = DevicePeaks("Test GPU", 1e12, 1e11, "datasheet:test")  # ridge at 10 FLOP/B
TRUE = Calibration(compute_efficiency=0.4, memory_efficiency=0.7, attention_efficiency=0.5, step_overhead_s=0.002)


def measured(batch: int, cost: StepCost, truth: Calibration = TRUE) -> StepSample:
    """A step as a device that runs exactly the model at `truth` would time it."""
    return StepSample(batch, cost, predict(truth, StepSample(batch, cost, 0.0), PEAKS))


def samples(intensities: list[float], truth: Calibration = TRUE) -> list[StepSample]:
    """Steps whose GEMMs run at these FLOP/byte, their bytes (weights and activations) growing with the
    batch, beside an attention (4 FLOP/byte, as in a grouped-query model) whose KV traffic grows too,
    at a short and a long context in turn: the roofs and the overhead separate."""
    out = []
    for i, x in enumerate(intensities):
        gemm_bytes, kv_bytes = 1e9 * (1 + 0.05 * i), 2.5e8 * (1 + i) * (4 if i % 2 else 1)
        cost = StepCost(flops=x * gemm_bytes + 4 * kv_bytes, bytes=gemm_bytes + kv_bytes,
                        weight_flops=x * gemm_bytes, attn_flops=4 * kv_bytes, weight_bytes=1e9, kv_bytes=kv_bytes)
        out.append(measured(i + 1, cost, truth))
    return out


def test_the_fit_recovers_known_constants_from_steps_on_both_sides_of_the_ridge():
    fit = fit_calibration(samples([0.5, 1, 2, 4, 8, 16, 32, 64]), PEAKS, source="t", fitted_on={})
    cal = fit.calibration
    assert cal.compute_efficiency == pytest.approx(0.4, rel=0.02)
    assert cal.memory_efficiency == pytest.approx(0.7, rel=0.02)
    assert cal.attention_efficiency == pytest.approx(0.5, rel=0.02)
    assert cal.step_overhead_s == pytest.approx(0.002, rel=0.1)
    assert fit.rms_relative_error < 0.01


def test_a_device_slower_than_the_searched_span_fits_at_its_edge_and_the_file_loads_again(tmp_path):
    """Steps compute-bound at 0.5% of the peak (a tiny model on a busy host): the fit stops at the
    search's edge instead of writing an efficiency that --calibration then refuses."""
    slow = Calibration(compute_efficiency=0.005, memory_efficiency=0.7, attention_efficiency=0.5,
                       step_overhead_s=0.002)
    cal = fit_calibration(samples([16, 32, 64, 128, 256], slow), PEAKS, source="t", fitted_on={}).calibration
    assert cal.compute_efficiency == pytest.approx(0.01)
    path = write(tmp_path, {"schema": "batchtop.calibration/1", **cal.as_dict()})
    assert load_calibration(path).compute_efficiency == pytest.approx(0.01)


def test_a_roof_the_steps_never_meet_is_reported_as_a_range_and_kept_near_the_default():
    fit = fit_calibration(samples([0.5, 1, 2, 3]), PEAKS, source="t", fitted_on={})  # all memory-bound
    lo, hi = fit.ranges["compute_efficiency"]
    assert hi / lo > 3 and lo <= DEFAULT.compute_efficiency <= hi <= 1.0
    assert fit.calibration.compute_efficiency == pytest.approx(DEFAULT.compute_efficiency, rel=0.02)
    assert fit.calibration.memory_efficiency == pytest.approx(0.7, rel=0.02)
    assert fit.calibration.attention_efficiency == pytest.approx(0.5, rel=0.02)
    caveats = fit.caveats()  # what calibrate and the accuracy bench print
    assert len(caveats) == 1 and caveats[0].startswith(f"compute_efficiency: any value in {lo:.2f}..{hi:.2f}")
    assert f"kept {fit.calibration.compute_efficiency:.2f}, the nearest to the default" in caveats[0]


CPU_LIKE = DevicePeaks("cpu-like", 170e9, 22e9, "measured:test")  # this 2-core host's measured roofs
# KV streamed at 13 GB/s, 0.3 ms a decoder layer beside 3 ms a step
CPU_TRUE = Calibration(compute_efficiency=0.8, memory_efficiency=0.9, attention_efficiency=0.6, step_overhead_s=0.003,
                       layer_latency_s=0.0003)


def decode(batch: int, context: int, layers: int = 8) -> StepCost:
    model = dataclasses.replace(preset("cpu-demo"), num_hidden_layers=layers)  # cpu-demo has 8
    return step_cost(model, "bfloat16", [Chunk(context, 1)] * batch, num_logit_rows=batch)


def sweep(contexts: tuple[int, ...], truth: Calibration = CPU_TRUE, depths: tuple[int, ...] = (8,)) -> list[StepSample]:
    """`batchtop calibrate`'s sweep (batch 1, 8, 32 at each context), for a model of each depth, on a
    device that runs the model exactly."""
    return [StepSample(b, decode(b, c, d), predict(truth, StepSample(b, decode(b, c, d), 0.0), CPU_LIKE, d), c)
            for d in depths for c in contexts for b in (1, 8, 32)]


def layers_of(steps: list[StepSample], depths: tuple[int, ...]) -> list[int]:
    return [d for d in depths for _ in range(len(steps) // len(depths))]


def test_a_sweep_at_two_contexts_and_two_depths_recovers_all_five_constants_and_times_other_steps_right():
    depths = (8, 24)
    steps = sweep((128, 512), depths=depths)
    fit = fit_calibration(steps, CPU_LIKE, source="t", fitted_on={}, layers=layers_of(steps, depths))
    assert fit.calibration.constants() == pytest.approx(CPU_TRUE.constants(), rel=0.02)
    assert fit.held == () and fit.bounded == () and fit.rms_relative_error < 0.005
    assert fit.caveats() == []
    for batch, context, layers in ((4, 1000, 8), (20, 400, 16), (48, 36, 32), (64, 2000, 24)):
        step = StepSample(batch, decode(batch, context, layers), 0.0)
        assert predict(fit.calibration, step, CPU_LIKE, layers) == pytest.approx(
            predict(CPU_TRUE, step, CPU_LIKE, layers), rel=0.01)


def test_one_depth_fits_overhead_and_layer_latency_as_one_constant_and_splits_it_as_it_says():
    fit = fit_calibration(sweep((128, 512)), CPU_LIKE, source="t", fitted_on={}, layers=8)
    cal = fit.calibration
    constant = CPU_TRUE.step_overhead_s + 8 * CPU_TRUE.layer_latency_s  # 5.4 ms a step
    assert cal.step_overhead_s + 8 * cal.layer_latency_s == pytest.approx(constant, rel=0.02)
    assert cal.step_overhead_s == DEFAULT.step_overhead_s  # at most the default's overhead stays per step
    assert cal.layer_latency_s == pytest.approx((constant - DEFAULT.step_overhead_s) / 8, rel=0.03)
    assert fit.rms_relative_error < 0.005
    assert fit.caveats() == [
        f"step overhead and layer latency: these steps all ran one model depth (8 layers), so the two are one "
        f"constant here ({1e3 * (cal.step_overhead_s + 8 * cal.layer_latency_s):.2f} ms a step); kept 2.00 ms of it "
        f"per step (at most the default's) and charged {1e6 * cal.layer_latency_s:.1f} us to each layer (steps of "
        f"models of two depths fit them apart)"]


def test_without_a_layer_count_the_fit_keeps_every_constant_in_the_step_overhead():
    fit = fit_calibration(sweep((128, 512)), CPU_LIKE, source="t", fitted_on={})
    assert fit.calibration.layer_latency_s == 0
    assert fit.calibration.step_overhead_s == pytest.approx(0.003 + 8 * 0.0003, rel=0.02)


def test_steps_faster_than_the_measured_bandwidth_raise_the_roof_to_the_fastest_step_and_fit_at_most_one():
    """cpu-demo's weights streamed at 3x the measured roof (a roof cached in a busy minute): the fit held
    the memory efficiency at 1 of that roof and timed every decode step ~40% slow (issue 52)."""
    beyond = dataclasses.replace(CPU_TRUE, memory_efficiency=3.0)
    steps = sweep((128, 512), beyond)
    fit = fit_calibration(steps, CPU_LIKE, source="t", fitted_on={}, layers=8)
    cal = fit.calibration
    assert max(cal.compute_efficiency, cal.memory_efficiency, cal.attention_efficiency) <= 1.0
    fastest = max(s.cost.bytes / s.seconds for s in steps)  # what the machine was seen to stream
    assert cal.roofs.peak_bytes_per_s == fastest and cal.roofs.peak_flops == CPU_LIKE.peak_flops
    assert cal.roofs.source == f"measured:test; raised by the calibration: memory 22 -> {fastest / 1e9:.3g} GB/s"
    assert any(c.startswith("roofs raised to what these steps did (memory 22 -> ") for c in fit.caveats())
    # no roof is raised past what a step did: the rest of the speed-up is the fit's to trade (held at 1)
    assert fit.bounded == ("memory_efficiency",)
    for step in steps:  # each step the fit saw, within what the fit itself says it misses by
        assert abs(predict(cal, step, cal.roofs, 8) / step.seconds - 1) <= 3 * fit.rms_relative_error


def test_a_datasheet_roof_is_never_raised_by_the_fit():
    truth = dataclasses.replace(TRUE, memory_efficiency=1.3, step_overhead_s=0.001)
    fit = fit_calibration(samples([0.5, 1, 2, 4, 8, 16], truth), PEAKS, source="t", fitted_on={})
    assert fit.calibration.roofs == PEAKS and fit.bounded == ("memory_efficiency",)


def test_a_fit_that_would_trade_the_overhead_for_streaming_above_the_datasheet_peak_is_held_at_one():
    """An H200-like sweep whose steps all take longer than their work at the roofs, but whose best
    unbounded fit streams the weights faster than the datasheet allows (1.08 on the real one)."""
    truth = dataclasses.replace(TRUE, memory_efficiency=1.3, step_overhead_s=0.001)
    steps = samples([0.5, 1, 2, 4, 8, 16], truth)
    fit = fit_calibration(steps, PEAKS, source="t", fitted_on={})
    assert fit.calibration.memory_efficiency == 1.0 and fit.bounded == ("memory_efficiency",)
    note = next(c for c in fit.caveats() if c.startswith("memory efficiency held at 1.00"))
    assert "these steps fit better above it (1." in note and "each step took longer than its work at the datasheet roofs" in note


def test_a_sweep_at_one_context_holds_the_attention_efficiency_at_the_default():
    # each row's KV read then grows exactly with its GEMM work: any attention efficiency fits, given
    # a matching compute efficiency
    fit = fit_calibration(sweep((128,)), CPU_LIKE, source="t", fitted_on={})
    assert fit.held == ("attention_efficiency",) and "attention_efficiency" not in fit.ranges
    assert fit.calibration.attention_efficiency == DEFAULT.attention_efficiency
    assert fit.rms_relative_error < 0.005
    assert fit.as_dict()["held_at_default"] == ["attention_efficiency"]
    assert fit.caveats()[0].startswith("attention_efficiency: these steps' contexts are too alike")


def test_a_few_hundred_steps_with_a_few_percent_of_noise_still_fit_the_attention_efficiency():
    steps = [StepSample(s.batch, s.cost, s.seconds * (1 + 0.01 * (i % 7 - 3)), s.context)
             for i, s in enumerate(sweep((128, 512)) * 50)]
    fit = fit_calibration(steps, CPU_LIKE, source="t", fitted_on={})
    assert fit.calibration.attention_efficiency == pytest.approx(0.6, rel=0.05)


def test_sweep_means_keep_one_step_per_batch_and_context_and_leave_a_burst_out():
    steps = [StepSample(4, StepCost(1.0, 2.0), t, 128) for t in (0.010, 0.011, 0.500, 0.010)] + [
        StepSample(4, StepCost(1.0, 3.0), 0.015, 512), StepSample(8, StepCost(2.0, 2.0), 0.02, 128)]
    assert [(s.batch, s.context, s.seconds) for s in sweep_means(steps)] == [
        (4, 128, pytest.approx(0.031 / 3)), (4, 512, 0.015), (8, 128, 0.02)]


def test_sweep_means_stay_between_the_two_speeds_of_a_host_that_flips_between_them():
    # 5 steps at 10 ms and 4 at 13: the median is the fast speed, the time they took averages 11.3 ms
    steps = [StepSample(1, StepCost(1.0, 2.0), t, 128) for t in [0.010] * 5 + [0.013] * 4]
    assert sweep_means(steps)[0].seconds == pytest.approx(0.102 / 9)


def test_sweep_means_keep_the_gemm_and_attention_work_apart():
    steps = [StepSample(2, decode(2, context), 0.01, 100) for context in (100, 101, 102)]
    assert sweep_means(steps)[0].cost == decode(2, 101)  # the mean step's figures, every field


def write(tmp_path, content) -> str:
    path = tmp_path / "cal.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


GOOD = {"compute_efficiency": 0.5, "memory_efficiency": 0.75, "attention_efficiency": 0.6, "step_overhead_s": 0.001}


def test_a_calibration_file_is_read_with_its_provenance(tmp_path):
    path = write(tmp_path, {**GOOD, "schema": "batchtop.calibration/1", "fitted_on": {"device": "X"}})
    cal = load_calibration(path)
    assert cal.constants() == {**GOOD, "layer_latency_s": 0.0}  # a file from before the per-layer term
    assert cal.source == path and cal.fitted_on == {"device": "X"}


def test_a_file_from_before_the_attention_efficiency_charges_the_kv_read_at_its_memory_efficiency(tmp_path):
    old = {k: v for k, v in GOOD.items() if k != "attention_efficiency"}
    cal = load_calibration(write(tmp_path, {**old, "schema": "batchtop.calibration/1"}))
    assert cal.attention_efficiency == cal.memory_efficiency == 0.75


def test_a_calibration_file_with_a_layer_latency_charges_it_per_layer_in_the_simulated_step(tmp_path):
    cal = load_calibration(write(tmp_path, {**GOOD, "layer_latency_s": 0.0005}))
    step = decode(1, 128)
    assert cal.step_time(step, CPU_LIKE, 24) - cal.step_time(step, CPU_LIKE) == pytest.approx(0.012)
    assert "500.0 us/layer" in cal.describe()


def test_a_file_fitted_before_the_bound_still_loads_and_says_its_efficiency_is_above_one(tmp_path):
    cal = load_calibration(write(tmp_path, {**GOOD, "memory_efficiency": 1.08}))
    assert cal.memory_efficiency == 1.08
    assert ("note: memory_efficiency 1.08 above 1, faster than the device's roofs (fitted before efficiencies "
            "were bounded): re-run batchtop calibrate") in cal.describe()
    assert "note" not in load_calibration(write(tmp_path, GOOD)).describe()


@pytest.mark.parametrize("content,needle", [
    ("{not json", "not JSON"),
    ("[1, 2]", "must be a JSON object"),
    ({**GOOD, "schema": "other/2"}, "schema is 'other/2'"),
    ({k: v for k, v in GOOD.items() if k != "memory_efficiency"}, "memory_efficiency is missing"),
    ({**GOOD, "compute_efficiency": -0.5}, "compute_efficiency must be > 0, got -0.5"),
    ({**GOOD, "step_overhead_s": 0}, "step_overhead_s must be > 0, got 0"),
    ({**GOOD, "memory_efficiency": "high"}, "memory_efficiency must be a number"),
    ({**GOOD, "memory_efficiency": True}, "memory_efficiency must be a number"),
    ('{"compute_efficiency": NaN, "memory_efficiency": 1, "step_overhead_s": 1}', "compute_efficiency must be a number"),
    ({**GOOD, "attention_efficiency": 0}, "attention_efficiency must be > 0, got 0"),
    ({**GOOD, "layer_latency_s": -1e-4}, "layer_latency_s must be in 0..1 s a layer, got -0.0001"),
    ({**GOOD, "layer_latency_s": "fast"}, "layer_latency_s must be a number, got 'fast'"),
    ({**GOOD, "attention_efficiency": -0.8}, "attention_efficiency must be > 0, got -0.8"),
    ({**GOOD, "attention_efficiency": "0.8"}, "attention_efficiency must be a number, got '0.8'"),
    ({**GOOD, "attention_efficiency": None}, "attention_efficiency must be a number, got None"),
    ('{"compute_efficiency": 1, "memory_efficiency": 1, "attention_efficiency": NaN, "step_overhead_s": 1}',
     "attention_efficiency must be a number, got nan"),
])
def test_a_bad_calibration_file_is_refused_naming_the_file_and_the_constant(tmp_path, content, needle):
    path = write(tmp_path, content)
    with pytest.raises(ConfigError) as err:
        load_calibration(path)
    assert str(err.value).startswith(f"calibration: {path}: ") and needle in str(err.value)


def test_a_missing_calibration_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no such calibration file"):
        load_calibration(str(tmp_path / "nope.json"))


def test_a_simulated_step_takes_each_decoder_layer_s_latency_longer():
    config = tiny_config(max_num_seqs=2)
    with_latency = dataclasses.replace(DEFAULT, layer_latency_s=0.0004)
    forwards = []
    for cal in (DEFAULT, with_latency):
        engine = Simulation(simulated_device("h200"), PEAKS, cal).engine(config)
        snaps = []
        assert run_workload(engine, [Request("r", (1, 2, 3), 3)], on_step=snaps.append).complete
        forwards.append([s.forward_s for s in snaps if s.is_step])
    layers = config.model.num_hidden_layers
    assert len(forwards[0]) == len(forwards[1]) > 1
    assert [b - a for a, b in zip(*forwards)] == pytest.approx([layers * 0.0004] * len(forwards[0]))
