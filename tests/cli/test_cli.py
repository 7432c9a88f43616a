"""The command line as a script or CI job uses it: exit codes, the metrics JSON, errors that name things."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from batchtop.core_engine.worker.model_runner import ModelRunner
from batchtop.core_engine.workload.spec import WorkloadSpec, load_workload
from tests.conftest import fail_on_call, wait_for_finishes
from batchtop.tui.cli import main

TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32"]


def invoke(args, **kwargs):
    return CliRunner().invoke(main, args, catch_exceptions=False, **kwargs)


def write_workload(tmp_path, lines):
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(json.dumps(x) if isinstance(x, dict) else x for x in lines) + "\n")
    return str(path)


def test_headless_runs_the_workload_and_writes_metrics(tmp_path):
    out = tmp_path / "m.json"
    result = invoke(["--headless", *TINY, "--num-requests", "12", "--time-scale", "0", "-o", str(out)])
    assert result.exit_code == 0, result.output
    m = json.loads(out.read_text())
    assert m["schema"] == "batchtop.metrics/1" and m["complete"] is True
    assert m["requests"] == {"submitted": 12, "completed": 12, "rejected": 0}
    expected = load_workload(WorkloadSpec(num_requests=12, prompt_scale=1 / 16, output_scale=1 / 4), 512)
    assert m["tokens"]["generated"] == sum(r.max_tokens for r in expected)
    assert m["tokens"]["prompt"] == sum(r.prompt_len for r in expected)
    assert m["tokens"]["computed"] >= m["tokens"]["prompt"] + m["tokens"]["generated"] - 12
    assert m["throughput_tok_s"] == pytest.approx(m["tokens"]["generated"] / m["wall_time_s"])
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert set(m[key]) >= {"p50", "p90", "p99"} and m[key]["p50"] <= m[key]["p99"]
    assert 0 < m["slot_utilization"] <= 1
    assert m["kv"]["free_blocks_at_end"] == m["kv"]["num_blocks"] == m["config"]["num_kv_blocks"]
    assert m["config"]["model"]["num_params"] > 0 and m["config"]["max_num_seqs"] == 16
    roof = m["roofline"]
    assert roof["peak_flops"] > 0 and roof["ridge_flop_per_byte"] == pytest.approx(roof["peak_flops"] / roof["peak_bytes_per_s"])
    assert roof["peaks_source"].startswith("measured:")
    assert roof["decode"]["steps"] + roof["prefill"]["steps"] == m["steps"]
    assert 0 < roof["decode"]["fraction_of_roof_mean"] and 0 < roof["prefill"]["intensity_mean"]


def test_headless_metrics_go_to_stdout_and_progress_never_does(tmp_path):
    result = CliRunner().invoke(main, ["--headless", *TINY, "--num-requests", "3", "--time-scale", "0"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["requests"]["completed"] == 3
    assert "building tiny" in result.stderr


@pytest.mark.parametrize("args,needle", [
    (["--max-num-seqs", "0"], "--max-num-seqs"),
    (["--block-size", "0"], "--block-size"),
    (["--num-kv-blocks", "0"], "--num-kv-blocks"),
    (["--model", "huge"], "--model"),
    (["--workload", "/no/such/file.jsonl"], "/no/such/file.jsonl: no such workload file"),
    (["--prompt-scale", "0"], "--prompt-scale"),
    (["-o", "/no/such/dir/m.json"], "--output"),
])
def test_bad_input_exits_2_naming_the_option_or_file(args, needle):
    result = CliRunner().invoke(main, ["--headless", *TINY, *args])
    assert result.exit_code == 2, result.output
    assert needle in result.output


def test_a_bad_workload_line_exits_2_naming_the_line(tmp_path):
    path = write_workload(tmp_path, [{"prompt_len": 3, "max_tokens": 2}, {"prompt_token_ids": [1, 99999], "max_tokens": 2}])
    result = CliRunner().invoke(main, ["--headless", *TINY, "--workload", path])
    assert result.exit_code == 2
    assert f"{path}:2: token id 99999 outside the vocabulary" in result.output


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_asking_for_cuda_without_a_gpu_exits_2():
    result = CliRunner().invoke(main, ["--headless", "--model", "tiny", "--device", "cuda"])
    assert result.exit_code == 2 and "--device: cuda was asked for" in result.output


def test_an_oversized_request_is_rejected_with_a_warning_and_the_rest_complete(tmp_path):
    path = write_workload(tmp_path, [{"id": "ok", "prompt_len": 3, "max_tokens": 2},
                                     {"id": "huge", "prompt_len": 300, "max_tokens": 100}])
    out = tmp_path / "m.json"
    result = CliRunner().invoke(main, ["--headless", *TINY, "--workload", path, "--num-kv-blocks", "8",
                                       "-o", str(out)])
    assert result.exit_code == 0
    assert "rejected request 'huge'" in result.stderr and "needs 25 KV blocks" in result.stderr
    assert "the pool has 8" in result.stderr
    m = json.loads(out.read_text())
    assert m["requests"] == {"submitted": 2, "completed": 1, "rejected": 1}


def test_an_engine_failure_exits_1_and_keeps_the_metrics_so_far(tmp_path, monkeypatch):
    monkeypatch.setattr(ModelRunner, "run", fail_on_call(ModelRunner.run, 5, "simulated device fault"))
    out = tmp_path / "m.json"
    result = CliRunner().invoke(main, ["--headless", *TINY, "--num-requests", "8", "--time-scale", "0",
                                       "-o", str(out)])
    assert result.exit_code == 1
    assert "simulated device fault" in result.stderr
    m = json.loads(out.read_text())
    assert m["complete"] is False and "simulated device fault" in m["error"] and m["steps"] == 4


def test_ctrl_c_writes_incomplete_metrics_and_exits_130(tmp_path):
    out, trace = tmp_path / "m.json", tmp_path / "t.jsonl"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "batchtop.tui", "--headless", *TINY, "--workload", "synthetic",
                             "--num-requests", "20000", "--prompt-mean", "4", "--output-mean", "4", "-o", str(out),
                             "--record", str(trace)],
                            stderr=subprocess.PIPE, text=True, env=env)
    assert "building tiny" in proc.stderr.readline()
    wait_for_finishes(trace)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    m = json.loads(out.read_text())
    assert m["complete"] is False and m["error"] == "interrupted"
    assert 0 < m["requests"]["completed"] < 20000 and m["steps"] > 0


def test_compare_runs_both_modes_on_the_same_workload(tmp_path):
    out = tmp_path / "c.json"
    result = CliRunner().invoke(main, ["compare", *TINY, "--num-requests", "24", "--max-num-seqs", "6",
                                       "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["schema"] == "batchtop.compare/1"
    s, c = doc["static"], doc["continuous"]
    assert s["mode"] == "static" and c["mode"] == "continuous"
    assert s["tokens"]["generated"] == c["tokens"]["generated"]
    assert s["steps"] > c["steps"] and s["padding_share"] > 0 == c["padding_share"]
    assert doc["speedup"] == pytest.approx(c["throughput_tok_s"] / s["throughput_tok_s"])
    assert "static vs continuous" in result.stdout and "TTFT p50 / p99" in result.stdout


def test_compare_prints_its_table_on_stdout_and_names_where_the_json_went_on_stderr(tmp_path, monkeypatch):
    """With no -o the JSON goes to ./batchtop-compare.json: stderr says so, stdout holds only the table."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["compare", *TINY, "--num-requests", "6", "--max-num-seqs", "3"])
    assert result.exit_code == 0, result.output
    assert "wrote the batchtop.compare/1 JSON to batchtop-compare.json" in result.stderr
    assert json.loads((tmp_path / "batchtop-compare.json").read_text())["schema"] == "batchtop.compare/1"
    assert "static vs continuous" in result.stdout and "batchtop.compare/1" not in result.stdout
    result = CliRunner().invoke(main, ["compare", *TINY, "--num-requests", "6", "--max-num-seqs", "3", "-o", "-"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["schema"] == "batchtop.compare/1" and "wrote the" not in result.stderr
    assert "static vs continuous" in result.stderr


def test_a_run_without_the_cpu_kernels_says_so_and_still_completes(tmp_path):
    """Where the kernels cannot be built (no compiler) the run falls back to torch ops, and says why."""
    out = tmp_path / "m.json"
    env = {**os.environ, "BATCHTOP_CPU_KERNEL": "0"}
    proc = subprocess.run([sys.executable, "-m", "batchtop.tui", "--headless", *TINY, "--num-requests", "6",
                           "--time-scale", "0", "-o", str(out)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "CPU kernels unavailable (turned off by BATCHTOP_CPU_KERNEL=0)" in proc.stderr
    assert json.loads(out.read_text())["complete"] is True
