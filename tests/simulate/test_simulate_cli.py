"""What-if runs from the command line: --simulate, --calibration and `batchtop calibrate`."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from batchtop.core_engine.config import preset
from batchtop.core_engine.run.resolve import GIB, resolve_config
from batchtop.core_engine.simulate.calibration import load_calibration
from batchtop.core_engine.simulate.simulated_devices import simulated_device
from batchtop.tui.cli import main

TINY = ["--model", "tiny", "--dtype", "float32"]
SMALL_RUN = ["--num-requests", "12", "--time-scale", "0"]


def invoke(args):
    return CliRunner().invoke(main, args)


def test_a_simulated_h200_run_sizes_its_pool_from_141_gib_and_says_it_is_simulated(tmp_path):
    out = tmp_path / "m.json"
    result = invoke(["--headless", "--simulate", "H200", "--model", "gpu-8b", *SMALL_RUN, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "simulating gpu-8b" in result.stderr and "on H200: no model runs" in result.stderr
    m = json.loads(out.read_text())
    sim = m["simulated"]
    assert sim["device"] == "H200" and sim["peaks_source"] == "datasheet:H200"
    assert sim["calibration"] == {"compute_efficiency": 0.6, "memory_efficiency": 0.8, "attention_efficiency": 0.8,
                                  "step_overhead_s": 0.002, "layer_latency_s": 0.0, "source": "defaults"}
    assert m["roofline"]["peaks_source"] == "datasheet:H200" and m["config"]["device"] == "cuda"
    assert m["requests"]["completed"] == 12 and m["throughput_tok_s"] > 0 and m["complete"]
    model = preset("gpu-8b")
    per_block = 2 * model.num_hidden_layers * 16 * model.kv_dim * 2
    used = m["kv"]["num_blocks"] * per_block + model.num_params() * 2
    assert 0.9 * 141 * GIB - 12 * GIB < used <= 0.9 * 141 * GIB  # weights + pool fill the share, less a reserve
    # the bundled trace plays at full size, as on a GPU
    assert m["workload"]["prompt_scale"] == m["workload"]["output_scale"] == 1.0


def test_gpu_memory_utilization_and_the_devices_memory_size_the_simulated_pool():
    h200, l4 = simulated_device("h200"), simulated_device("l4")
    full = resolve_config(simulate=h200, model="gpu-1b")
    half = resolve_config(simulate=h200, model="gpu-1b", gpu_memory_utilization=0.45)
    small = resolve_config(simulate=l4, model="gpu-1b")
    assert full.num_kv_blocks > 2 * half.num_kv_blocks > small.num_kv_blocks > 0
    assert resolve_config(simulate=l4).model.name == "gpu-1b"  # under 40 GiB: the small default model
    assert resolve_config(simulate=h200).model.name == "gpu-8b"


def test_simulating_this_cpu_uses_its_measured_roofs_and_the_cpu_defaults(tmp_path):
    out = tmp_path / "m.json"
    result = invoke(["--headless", "--simulate", "cpu", *TINY, *SMALL_RUN, "-o", str(out)])
    assert result.exit_code == 0, result.output
    m = json.loads(out.read_text())
    assert m["simulated"]["peaks_source"].startswith("measured:") and m["config"]["num_kv_blocks"] == 512
    assert m["workload"]["prompt_scale"] == 1 / 16


@pytest.mark.parametrize("args,needle", [
    (["--model", "tiny", "--simulate", "tpu9"], "--simulate: unknown device 'tpu9' (choose cpu, h200,"),
    (["--model", "tiny", "--simulate", "h200", "--device", "cpu"], "--device: cannot be combined with --simulate"),
    (["--model", "tiny", "--calibration", "cal.json"], "--calibration: only applies to a --simulate run"),
    (["--model", "gpu-8b", "--simulate", "l4", "--gpu-memory-utilization", "0.5"], "--gpu-memory-utilization"),
])
def test_bad_simulate_options_exit_2_naming_the_option(args, needle):
    result = invoke(["--headless", *args])
    assert result.exit_code == 2, result.output
    assert needle in result.output


@pytest.mark.parametrize("constants,needle", [
    ({"memory_efficiency": 0}, "memory_efficiency must be > 0, got 0"),
    ({"attention_efficiency": 0}, "attention_efficiency must be > 0, got 0"),
    ({"attention_efficiency": -1.5}, "attention_efficiency must be > 0, got -1.5"),
    ({"attention_efficiency": "fast"}, "attention_efficiency must be a number, got 'fast'"),
    ({"attention_efficiency": float("nan")}, "attention_efficiency must be a number, got nan"),
])
def test_a_bad_calibration_file_exits_2_naming_it_and_the_constant(tmp_path, constants, needle):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"compute_efficiency": 0.5, "memory_efficiency": 0.7, "step_overhead_s": 0.001,
                                **constants}))
    result = invoke(["--headless", "--simulate", "h100", *TINY, "--calibration", str(path)])
    assert result.exit_code == 2
    assert f"--calibration: {path}: {needle}" in result.output


def test_compare_on_a_simulated_device_labels_the_table_as_modelled(tmp_path):
    out = tmp_path / "c.json"
    result = invoke(["compare", "--simulate", "a100-80gb", *TINY, "--num-kv-blocks", "256", "--max-num-seqs", "8",
                     "--num-requests", "24", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "SIMULATED A100-SXM4-80GB: static vs continuous" in result.stdout and "decode FLOP/byte" in result.stdout
    doc = json.loads(out.read_text())
    assert doc["static"]["simulated"]["device"] == doc["continuous"]["simulated"]["device"] == "A100-SXM4-80GB"
    assert doc["speedup"] > 1


def test_calibrate_measures_fits_and_writes_a_file_simulate_accepts(tmp_path):
    cal = tmp_path / "cal.json"
    result = invoke(["calibrate", *TINY, "--device", "cpu", "--batches", "1,4", "--context", "64,16", "--steps", "3",
                     "-o", str(cal)])
    assert result.exit_code == 0, result.output
    doc = json.loads(cal.read_text())
    assert doc["fitted_on"]["batches"] == [1, 4] and doc["fitted_on"]["contexts"] == [16, 64]
    assert [(s["batch"], s["context"]) for s in doc["samples"]] == [(1, 16), (1, 64), (4, 16), (4, 64)]
    assert doc["fit"]["held_at_default"] == [] and doc["attention_efficiency"] > 0
    fitted = load_calibration(str(cal))
    assert fitted.step_overhead_s > 0 and fitted.fitted_on["model"] == "tiny"
    assert "measured ms" in result.stdout and "attention eff" in result.stdout
    assert f"wrote the batchtop.calibration/1 JSON to {cal}" in result.stderr
    out = tmp_path / "m.json"
    result = invoke(["--headless", "--simulate", "cpu", *TINY, *SMALL_RUN, "--calibration", str(cal), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["simulated"]["calibration"]["source"] == str(cal)


def test_calibrate_at_one_context_keeps_the_default_attention_efficiency_and_says_so(tmp_path):
    cal = tmp_path / "cal.json"
    result = invoke(["calibrate", *TINY, "--device", "cpu", "--batches", "1,4", "--context", "16", "--steps", "3",
                     "-o", str(cal)])
    assert result.exit_code == 0, result.output
    assert "attention_efficiency: these steps' contexts are too alike" in result.stderr
    doc = json.loads(cal.read_text())
    assert doc["attention_efficiency"] == 0.8 and doc["fit"]["held_at_default"] == ["attention_efficiency"]


@pytest.mark.parametrize("batches", ["8", "1,1", "1,x", "0,4", "1,100000"])
def test_calibrate_needs_two_batch_sizes(batches, tmp_path):
    result = invoke(["calibrate", *TINY, "--batches", batches, "-o", str(tmp_path / "c.json")])
    assert result.exit_code == 2 and "--batches" in result.output


@pytest.mark.parametrize("contexts", ["", "128,x", "0,512", "128,99999999999"])
def test_calibrate_refuses_a_bad_context(contexts, tmp_path):
    result = invoke(["calibrate", *TINY, "--context", contexts, "-o", str(tmp_path / "c.json")])
    assert result.exit_code == 2 and "--context" in result.output


def test_calibrate_fits_a_recorded_session_but_not_a_simulated_one(tmp_path):
    real, sim = tmp_path / "real.jsonl", tmp_path / "sim.jsonl"
    for trace, extra in ((real, ["--device", "cpu"]), (sim, ["--simulate", "h200", "--num-kv-blocks", "64"])):
        result = invoke(["--headless", *TINY, *extra, *SMALL_RUN, "--record", str(trace), "-o", str(tmp_path / "m.json")])
        assert result.exit_code == 0, result.output
    result = invoke(["calibrate", "--from-trace", str(real), "-o", str(tmp_path / "cal.json")])
    assert result.exit_code == 0, result.output
    assert load_calibration(str(tmp_path / "cal.json")).fitted_on["trace"] == str(real)
    result = invoke(["calibrate", "--from-trace", str(sim), "-o", str(tmp_path / "cal2.json")])
    assert result.exit_code == 2 and "a simulated session" in result.output


def test_a_simulated_recording_replays_as_simulated(tmp_path):
    trace = tmp_path / "sim.jsonl"
    result = invoke(["--headless", *TINY, "--simulate", "h200", "--num-kv-blocks", "64", *SMALL_RUN,
                     "--record", str(trace), "-o", str(tmp_path / "m.json")])
    assert result.exit_code == 0, result.output
    result = invoke(["replay", str(trace), "--headless", "-o", str(tmp_path / "r.json")])
    assert result.exit_code == 0
    replayed, live = (json.loads((tmp_path / name).read_text()) for name in ("r.json", "m.json"))
    assert replayed["simulated"] == live["simulated"] and replayed["wall_time_s"] == live["wall_time_s"]


def test_serve_refuses_a_simulated_device():
    result = invoke(["serve", *TINY, "--simulate", "h200", "--port", "0", "--headless"])
    assert result.exit_code == 2 and "--simulate: a server answers real clients in real time" in result.output


def test_a_calibration_from_another_device_is_used_with_a_warning(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"compute_efficiency": 0.5, "memory_efficiency": 0.7, "step_overhead_s": 0.001,
                                "fitted_on": {"device": "NVIDIA H100 80GB HBM3"}}))
    for device, warned in (("h100", False), ("h200", True)):
        result = invoke(["--headless", "--simulate", device, *TINY, "--num-kv-blocks", "64", *SMALL_RUN,
                         "--calibration", str(path), "-o", str(tmp_path / "m.json")])
        assert result.exit_code == 0, result.output
        assert ("the calibration was fitted on NVIDIA H100 80GB HBM3, this run simulates H200" in result.stderr) == warned
