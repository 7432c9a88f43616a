"""Prefix caching in recordings, metrics and /metrics: what replay needs to draw the KV map's new states
and the cached-token counts, and old traces (recorded before it) still replaying."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from batchtop.core_engine.config import config_from_dict
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.serve.exporter import VllmMetrics
from batchtop.core_engine.trace.trace import read_trace
from batchtop.tui.cli import main
from tests.conftest import run_all, tiny_config

OLD_TRACE = Path(__file__).resolve().parents[1] / "data" / "trace-before-prefix-caching.jsonl"
TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32"]


def shared_prefix_workload(path: Path) -> str:
    lines = [{"id": f"r{i}", "prompt_token_ids": list(range(1, 13)) + [40 + i, 60 + i], "max_tokens": 4 + i % 3}
             for i in range(8)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def record(tmp_path: Path, *extra: str) -> tuple[str, dict]:
    trace, out = tmp_path / "run.jsonl", tmp_path / "metrics.json"
    result = CliRunner().invoke(main, ["--headless", *TINY, "--workload", shared_prefix_workload(tmp_path / "w.jsonl"),
                                       "--max-num-seqs", "4", "--block-size", "4", "--num-kv-blocks", "24",
                                       "--time-scale", "0", "--record", str(trace), "-o", str(out), *extra])
    assert result.exit_code == 0, result.output
    return str(trace), json.loads(out.read_text())


def test_a_trace_recorded_before_prefix_caching_still_replays():
    out = CliRunner().invoke(main, ["replay", str(OLD_TRACE), "--headless"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["steps"] == 13 and doc["tokens"]["computed"] == 141 and doc["tokens"]["cached"] == 0
    assert doc["prefix_cache"] == {"queries": 0, "hits": 0, "hit_rate": None}
    header = read_trace(str(OLD_TRACE)).header
    assert "enable_prefix_caching" not in header["config"]
    assert config_from_dict(header["config"]).enable_prefix_caching is False  # it ran without one
    snaps = [snap for _, snap in read_trace(str(OLD_TRACE)).snapshots() if snap is not None]
    assert snaps and all(s.block_refs == () and all(x.num_cached == 0 for x in s.slots) for s in snaps)


def test_a_recording_replays_the_kv_maps_states_and_the_cached_counts(tmp_path):
    trace, original = record(tmp_path)
    assert original["config"]["enable_prefix_caching"] is True
    # r0 computes the 12-token prefix (3 blocks) in step 1; r1..r3 find it in that step, r4..r7 later
    assert original["prefix_cache"] == {"queries": 8 * 14, "hits": 7 * 12, "hit_rate": 7 * 12 / (8 * 14)}
    assert original["tokens"]["cached"] == 7 * 12
    replayed = CliRunner().invoke(main, ["replay", trace, "--headless"])
    assert {k: v for k, v in json.loads(replayed.stdout).items() if k != "replayed_from"} == original
    recorded = read_trace(trace)
    assert recorded.header["config"]["enable_prefix_caching"] is True
    engine = Engine(config_from_dict(recorded.header["config"]))
    live = iter(run_all(engine, [Request(f"r{i}", tuple(range(1, 13)) + (40 + i, 60 + i), 4 + i % 3)
                                 for i in range(8)])[1])
    seen_shared = seen_cached = 0
    for event, snap in recorded.snapshots():
        if event["type"] != "step":
            continue
        ours = next(live)
        assert snap.block_refs == ours.block_refs and snap.block_owners == ours.block_owners
        assert [s.num_cached for s in snap.slots] == [s.num_cached for s in ours.slots]
        seen_shared += max(snap.block_refs) > 1
        seen_cached += -1 in snap.block_refs
    assert seen_shared and seen_cached


def test_without_the_cache_the_trace_carries_no_holder_map_and_says_so(tmp_path):
    trace, metrics = record(tmp_path, "--no-enable-prefix-caching")
    assert metrics["config"]["enable_prefix_caching"] is False
    assert metrics["prefix_cache"] == {"queries": 0, "hits": 0, "hit_rate": None} and metrics["tokens"]["cached"] == 0
    assert '"kv_refs"' not in Path(trace).read_text()
    assert metrics["tokens"]["computed"] > 8 * 14  # every prompt token computed


def test_metrics_expose_vllms_prefix_cache_counters():
    config = tiny_config(max_num_seqs=4)
    exporter = VllmMetrics(config, "tiny")
    engine = Engine(config)
    engine.load_workload([Request("a", tuple(range(10)), 2), Request("b", tuple(range(9)) + (50,), 2)])
    while not engine.is_done():
        exporter.observe(engine.step())
    text = exporter.exposition().decode()

    def value(name: str) -> float:
        line = next(x for x in text.splitlines() if x.startswith(name + "{"))
        return float(line.rsplit(" ", 1)[1])

    assert value("vllm:prefix_cache_queries_total") == 20
    assert value("vllm:prefix_cache_hits_total") == 8 == value("vllm:prompt_tokens_cached_total")
    assert 'enable_prefix_caching="True"' in text
