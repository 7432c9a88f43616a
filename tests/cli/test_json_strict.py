"""Every JSON document batchtop writes is strict JSON: no NaN, no Infinity (Python's json writes both
unless told not to, and most other parsers refuse them). Each document is produced the way a user
produces it and loaded with a parser that raises on those constants."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchtop.tui.cli import main
from tests.support.serving import serving

TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32"]


def _refuse(name: str) -> float:
    raise ValueError(f"{name} in a JSON document")


def strict(text: str) -> object:
    return json.loads(text, parse_constant=_refuse)


def strict_lines(path: Path) -> list[object]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [strict(line) for line in f if line.strip()]


def invoke(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result


def refused_workload(tmp_path: Path) -> str:
    """Requests that can never fit a 2-block pool: every one is refused, nothing is generated."""
    path = tmp_path / "refused.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt_len": 40, "max_tokens": 8}) + "\n" for i in range(3)))
    return str(path)


def test_headless_metrics_a_trace_and_its_replay_are_strict_json(tmp_path):
    metrics, trace, replayed = tmp_path / "m.json", tmp_path / "run.jsonl.gz", tmp_path / "r.json"
    invoke("--headless", *TINY, "--num-requests", "12", "--time-scale", "0", "--record", str(trace),
           "-o", str(metrics))
    assert strict(metrics.read_text())["requests"]["completed"] == 12
    events = strict_lines(trace)
    assert events[0]["type"] == "header" and events[-1]["type"] == "end"
    invoke("replay", str(trace), "--headless", "-o", str(replayed))
    assert strict(replayed.read_text())["steps"] == strict(metrics.read_text())["steps"]
    calibration = tmp_path / "cal.json"
    invoke("calibrate", "--from-trace", str(trace), "-o", str(calibration))
    assert strict(calibration.read_text())["schema"] == "batchtop.calibration/1"


def test_a_run_where_every_request_is_refused_writes_strict_metrics_and_trace(tmp_path):
    metrics, trace, replayed = tmp_path / "m.json", tmp_path / "run.jsonl", tmp_path / "r.json"
    invoke("--headless", *TINY, "--workload", refused_workload(tmp_path), "--num-kv-blocks", "2",
           "--time-scale", "0", "--record", str(trace), "-o", str(metrics))
    doc = strict(metrics.read_text())
    assert doc["requests"] == {"submitted": 3, "completed": 0, "rejected": 3}
    assert doc["ttft_s"]["p50"] is None and doc["throughput_tok_s"] == 0.0
    strict_lines(trace)
    invoke("replay", str(trace), "--headless", "-o", str(replayed))
    strict(replayed.read_text())


def test_compare_where_every_request_is_refused_writes_a_null_speedup_and_says_why(tmp_path):
    out = tmp_path / "compare.json"
    result = invoke("compare", *TINY, "--workload", refused_workload(tmp_path), "--num-kv-blocks", "2",
                    "-o", str(out))
    doc = strict(out.read_text())
    assert doc["speedup"] is None
    assert doc["static"]["requests"]["rejected"] == doc["continuous"]["requests"]["rejected"] == 3
    assert "no speedup" in result.stdout and "all 3 requests were refused" in result.stdout


def test_compare_and_a_simulated_run_are_strict_json(tmp_path):
    out = tmp_path / "compare.json"
    invoke("compare", *TINY, "--workload", "synthetic", "--num-requests", "8", "--prompt-mean", "8",
           "--output-mean", "8", "-o", str(out))
    assert strict(out.read_text())["speedup"] > 0
    simulated = tmp_path / "sim.json"
    invoke("--headless", "--model", "tiny", "--simulate", "h200", "--num-kv-blocks", "256", "--num-requests", "16",
           "--time-scale", "0", "-o", str(simulated))
    assert strict(simulated.read_text())["simulated"]["device"]


def test_a_measured_calibration_is_strict_json(tmp_path):
    out = tmp_path / "cal.json"
    invoke("calibrate", *TINY, "--batches", "1,2,4", "--steps", "2", "--context", "8", "-o", str(out))
    doc = strict(out.read_text())
    assert doc["compute_efficiency"] > 0 and len(doc["samples"]) == 3


def test_export_checkpoints_json_files_are_strict(tmp_path):
    out = tmp_path / "tiny-hf"
    invoke("export-checkpoint", str(out), "--model", "tiny")
    names = sorted(p.name for p in out.glob("*.json"))
    assert {"config.json", "generation_config.json", "tokenizer.json"} <= set(names)
    for path in out.glob("*.json"):
        strict(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("stream", [False, True])
def test_serves_answers_are_strict_json(stream):
    with serving() as server:
        body = {"prompt": [1, 2, 3], "max_tokens": 4, "stream": stream,
                **({"stream_options": {"include_usage": True}} if stream else {})}
        response = server.post("/v1/completions", json=body)
        assert response.status_code == 200
        if not stream:
            assert strict(response.text)["usage"]["completion_tokens"] == 4
            assert strict(server.post("/v1/completions", json={"prompt": [1], "max_tokens": -1}).text)["error"]
            return
        chunks = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
        assert chunks[-1] == "[DONE]" and len(chunks) > 2
        for chunk in chunks[:-1]:
            strict(chunk)


def test_cached_device_peaks_that_are_nan_are_measured_again(tmp_path, monkeypatch):
    from batchtop.core_engine.perf import device_peaks as peaks_module
    monkeypatch.setenv("BATCHTOP_CACHE_DIR", str(tmp_path))
    measured = peaks_module.DevicePeaks("this cpu", 1e11, 2e10, "measured:test")
    monkeypatch.setattr(peaks_module, "measure_peaks", lambda device, dtype: measured)
    cache = tmp_path / "batchtop" / f"peaks-{peaks_module._cache_key('cpu', 'float32')}.json"
    cache.parent.mkdir(parents=True)
    cache.write_text('{"device_name": "x", "peak_flops": NaN, "peak_bytes_per_s": 1e10, "source": "measured"}')
    peaks = peaks_module.device_peaks("cpu", "float32")
    assert peaks == measured
    assert strict(cache.read_text())["peak_flops"] == 1e11  # the broken cache was replaced


def test_an_attach_sample_of_a_server_that_exposes_nan_is_strict_json():
    import re
    from batchtop.core_engine.attach.scrape.sample import parse_exposition
    text = (Path(__file__).resolve().parents[1] / "data" / "vllm-0.32-cpu-idle.prom").read_text()
    text = re.sub(r"^(vllm:(num_requests_running|kv_cache_usage_perc)\{[^}]*\}) .*$", r"\1 NaN", text, flags=re.M)
    text = re.sub(r"^(vllm:num_requests_waiting\{[^}]*\}) .*$", r"\1 +Inf", text, flags=re.M)
    sample = parse_exposition(text, 1.0)  # Prometheus allows NaN and +Inf as values; vLLM's own parser too
    assert sample.running is None and sample.kv_usage is None and sample.waiting is None
    strict(json.dumps(sample.as_dict(), allow_nan=False))
