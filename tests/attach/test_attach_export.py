"""--export-workload: the traffic a server saw, as a workload. Its length means and arrival rate equal
the histograms' and counters' within their bucket resolution; the header comment says how it was
made and every reader of workloads skips it; `batchtop compare --simulate` runs the file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchtop.core_engine.attach.scrape.histogram import Histogram
from batchtop.core_engine.attach.monitor import Monitor
from batchtop.core_engine.attach.record.record import monitor_for, recorded_ticks
from batchtop.core_engine.attach.scrape.sample import parse_exposition
from batchtop.core_engine.attach.verdict.verdict_span import step_buckets
from batchtop.core_engine.attach.record.workload_export import ExportError, build_workload
from batchtop.core_engine.trace.trace import read_trace
from batchtop.core_engine.workload.spec import WorkloadSpec, load_workload
from batchtop.tui.cli import main
from tests.support.attach_helpers import DATA, live
from tests.support.scripted_vllm import ScriptedVllm, Tick, scripted_server

RECORDING = str(DATA / "attach-vllm-0.32-cpu.jsonl.gz")


def resolution(h: Histogram) -> tuple[float, float]:
    """The lowest and highest mean the buckets allow: every observation at its bucket's floor or top."""
    rows = [(lo, hi, n) for lo, hi, n in step_buckets(h) if n]
    return sum(math.floor(lo) + 1 for lo, _, n in rows for _ in range(int(n))) / h.count, \
        sum(hi for _, hi, n in rows for _ in range(int(n))) / h.count


def mixed_traffic(n: int = 30) -> list[Tick]:
    """Requests finishing two a second, prompts of 30 / 70 / 400 and outputs of 8 / 120 tokens."""
    prompts, outputs = (30, 70, 400), (8, 120)
    return [Tick(6, 3, kv=0.4, steps=(6,) * 20, finished=tuple((prompts[(2 * i + j) % 3], outputs[(i + j) % 2])
                                                                for j in range(2))) for i in range(n)]


def session(ticks: list[Tick]) -> Monitor:
    server, monitor = ScriptedVllm(), Monitor(["http://scripted:8000/metrics"])
    for i, tick in enumerate(ticks):
        monitor.feed([live(parse_exposition(server.text(tick), float(i)))], float(i))
    return monitor


def check_matches(monitor: Monitor, workload) -> None:
    total = monitor.windows[0].session.delta
    n = len(workload.lines)
    for key, field in (("prompt_len", "prompt_len"), ("generation_len", "max_tokens")):
        h = total.histograms[key]
        mean = sum(line[field] for line in workload.lines) / n
        low, high = resolution(h)
        assert low <= mean <= high and low <= h.mean <= high
        assert mean == pytest.approx(h.mean, abs=0.5)  # and the exact mean, rounding aside
        for lo, hi, count in step_buckets(h):  # every bucket its share of the lines
            inside = sum(lo < line[field] <= hi for line in workload.lines)
            assert abs(inside - n * count / h.count) < 1
    assert workload.lines[-1]["arrival_s"] == pytest.approx(n / workload.rate, rel=1e-6)


def test_the_exported_lengths_and_rate_match_the_histograms_and_counters():
    monitor = session(mixed_traffic())
    workload = build_workload([w.session for w in monitor.windows], monitor.urls, "vllm")
    # 29 intervals of 1 s, two requests finished in each, the requests in flight unchanged
    assert len(workload.lines) == 58 and workload.rate == pytest.approx(2.0)
    check_matches(monitor, workload)
    arrivals = [line["arrival_s"] for line in workload.lines]
    assert arrivals == sorted(arrivals) and len({round(b - a, 6) for a, b in zip(arrivals, arrivals[1:])}) > 10


def test_the_real_vllm_recording_exports_its_64_requests_of_64_and_256_tokens():
    trace = read_trace(RECORDING)
    monitor = monitor_for(trace)
    for t, results in recorded_ticks(trace):
        monitor.feed(results, t)
    workload = build_workload([w.session for w in monitor.windows], monitor.urls, "vllm")
    # 48 finished while watched, 16 more running at the end, none before: the bench client's 64
    assert len(workload.lines) == 64
    # the buckets say (50, 100] and (200, 500]; the sums say 3079 prompt tokens in 48 and 256 output tokens each
    assert all(50 < line["prompt_len"] <= 100 and 200 < line["max_tokens"] <= 500 for line in workload.lines)
    assert sum(x["prompt_len"] for x in workload.lines) == round(64 * 3079 / 48)
    assert sum(x["max_tokens"] for x in workload.lines) == 64 * 256
    check_matches(monitor, workload)


def test_the_file_loads_as_a_workload_and_compare_simulates_it(tmp_path):
    monitor = session(mixed_traffic(12))
    workload = build_workload([w.session for w in monitor.windows], monitor.urls, "vllm")
    path = tmp_path / "traffic.jsonl"
    path.write_text(workload.text())
    assert path.read_text().startswith("# batchtop attach --export-workload: 22 requests as vLLM at")
    requests = load_workload(WorkloadSpec(path=str(path)), vocab_size=512)
    assert [(r.prompt_len, r.max_tokens) for r in requests] == [(x["prompt_len"], x["max_tokens"]) for x in workload.lines]
    no_suffix = tmp_path / "traffic"  # no .jsonl: told apart by its first line that is not a comment
    no_suffix.write_text(workload.text())
    assert len(load_workload(WorkloadSpec(path=str(no_suffix)), vocab_size=512)) == 22
    out = tmp_path / "compare.json"
    result = CliRunner().invoke(main, ["compare", "--simulate", "h100", "--max-num-seqs", "256", "--workload",
                                       str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["continuous"]["requests"]["completed"] == 22
    assert doc["continuous"]["tokens"]["generated"] == sum(x["max_tokens"] for x in workload.lines)


def test_attach_exports_at_the_end_of_a_live_watch(tmp_path):
    path = tmp_path / "live.jsonl"
    with scripted_server(mixed_traffic(200)) as url:
        result = CliRunner().invoke(main, ["attach", url, "--headless", "--duration", "1.5", "--interval", "0.1",
                                           "--export-workload", str(path), "-o", str(tmp_path / "a.json")])
    assert result.exit_code == 0, result.output
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# batchtop attach --export-workload:") and "Poisson at" in lines[1]
    body = [json.loads(x) for x in lines if not x.startswith("#")]
    assert len(body) >= 20 and "wrote" in result.output and "batchtop compare --simulate h100" in result.output


def test_replay_exports_from_an_attach_recording_and_refuses_an_engine_trace(tmp_path):
    path = tmp_path / "rec.jsonl"
    result = CliRunner().invoke(main, ["replay", RECORDING, "--export-workload", str(path)])
    assert result.exit_code == 0, result.output
    assert sum(not x.startswith("#") for x in path.read_text().splitlines()) == 64
    engine_trace = str(DATA / "trace-before-prefix-caching.jsonl")
    result = CliRunner().invoke(main, ["replay", engine_trace, "--export-workload", str(tmp_path / "x.jsonl")])
    assert result.exit_code == 2 and "--export-workload" in result.output and "engine session" in result.output
    assert not (tmp_path / "x.jsonl").exists()


def test_a_server_without_length_histograms_exports_nothing_and_says_why():
    monitor = Monitor(["llama"])
    text = (DATA / "llamacpp-a.prom").read_text()
    for t in (0.0, 1.0):
        monitor.feed([live(parse_exposition(text, t))], t)
    with pytest.raises(ExportError, match="llama.cpp exposes no per-request length histograms"):
        build_workload([w.session for w in monitor.windows], monitor.urls, "llamacpp")
    quiet = session([Tick(1, 0, steps=(1,))] * 3)  # a session in which nothing finished
    with pytest.raises(ExportError, match="no request finished"):
        build_workload([w.session for w in quiet.windows], quiet.urls, "vllm")


def test_an_unwritable_export_path_fails_before_the_watch(tmp_path):
    missing = tmp_path / "no" / "such" / "dir" / "w.jsonl"
    result = CliRunner().invoke(main, ["attach", "http://127.0.0.1:9", "--headless", "--duration", "1",
                                       "--export-workload", str(missing)])
    assert result.exit_code == 2 and "--export-workload" in result.output and "does not exist" in result.output
    assert not Path(missing).parent.exists()


def test_a_live_watch_of_a_server_without_length_histograms_says_why_and_exits_1(tmp_path):
    from tests.support.route_server import Routes, route_server
    path = tmp_path / "w.jsonl"
    routes = Routes({"/metrics": (200, (DATA / "llamacpp-a.prom").read_text()), "/slots": (501, "off")})
    with route_server(routes) as url:
        result = CliRunner().invoke(main, ["attach", url, "--headless", "--duration", "0.6", "--interval", "0.2",
                                           "--export-workload", str(path), "-o", str(tmp_path / "a.json")])
    assert result.exit_code == 1
    assert ("--export-workload: llama.cpp exposes no per-request length histograms: nothing to draw the lengths "
            f"from; nothing written to {path}") in result.output
    assert not path.exists() and json.loads((tmp_path / "a.json").read_text())["complete"] is True


@pytest.mark.parametrize("damage", ["NaN", "gone"])
def test_a_length_histogram_whose_sum_is_nan_or_missing_is_drawn_from_its_buckets_alone(damage):
    """Before: the missing _sum read as 0, and the lines' prompt mean was 0 tokens for prompts of 30-400."""
    import re
    server, monitor = ScriptedVllm(), Monitor(["http://scripted:8000/metrics"])
    for i, tick in enumerate(mixed_traffic(12)):
        text = re.sub(r"(vllm:request_prompt_tokens_sum\{[^}]*\}) \S+\n", r"\1 NaN\n" if damage == "NaN" else "",
                      server.text(tick))
        monitor.feed([live(parse_exposition(text, float(i)))], float(i))
    workload = build_workload([w.session for w in monitor.windows], monitor.urls, "vllm")
    h = monitor.windows[0].session.delta.histograms["prompt_len"]
    for lo, hi, count in step_buckets(h):  # every bucket its share of the lines, spread evenly across it
        inside = [line["prompt_len"] for line in workload.lines if lo < line["prompt_len"] <= hi]
        assert abs(len(inside) - len(workload.lines) * count / h.count) < 1
    assert workload.prompt_mean == pytest.approx(sum(x["prompt_len"] for x in workload.lines) / len(workload.lines))
    low, high = resolution(h)
    assert low <= workload.prompt_mean <= high
    assert "its _sum (0) not a mean its buckets allow" in workload.text().splitlines()[2]
    assert workload.output_mean == pytest.approx(h_mean(monitor, "generation_len"))  # the intact one as before


def h_mean(monitor: Monitor, key: str) -> float:
    return monitor.windows[0].session.delta.histograms[key].mean


def test_an_export_into_a_fifo_is_written_into_it_whole_and_suggests_no_command(tmp_path):
    """A FIFO (or /dev/null, a process substitution) is written into, never replaced; it cannot be read
    back, so the line does not offer `compare --workload` on it."""
    import os
    import threading
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    result = CliRunner().invoke(main, ["replay", RECORDING, "--export-workload", str(fifo)])
    reader.join(10)
    assert result.exit_code == 0, result.output
    assert fifo.is_fifo() and sum(not x.startswith("#") for x in got[0].splitlines()) == 64
    assert f"wrote 64 requests to {fifo} (" in result.output and "try batchtop compare" not in result.output


def test_the_quiet_scrapes_before_the_load_and_after_it_do_not_dilute_the_rate():
    """The live vLLM run (32 slots, 2 clients) began 22 s before its load: 24 requests exported at
    0.52/s over the 45.8 s watch where vLLM's bench client sent them at 0.92/s."""
    quiet = [Tick(0, 0, kv=0.0)] * 10
    monitor = session(quiet + mixed_traffic(30) + quiet)  # 2 requests finish a second while the load runs
    workload = build_workload([w.session for w in monitor.windows], monitor.urls, "vllm")
    assert len(workload.lines) == 60
    assert 60 / 31 <= workload.rate <= 60 / 29  # the load's 30 s, to a scrape at either end (not 60 / 49 s)
    assert "over 31.0 s of traffic (a 49.0 s watch, less its quiet scrapes" in workload.header[0]
    gap = session(mixed_traffic(10) + quiet + mixed_traffic(10))  # a quiet gap inside the traffic is its own
    # 29 intervals, 2 finished in each busy one but the very first (no scrape before it): 38 requests
    assert build_workload([w.session for w in gap.windows], gap.urls, "vllm").rate == pytest.approx(38 / 29)


def test_the_real_vllm_run_that_began_before_its_load_exports_the_load_rate():
    trace = read_trace(str(DATA / "attach-vllm-0.32-cpu-4slots-32clients-drained.jsonl.gz"))
    monitor = monitor_for(trace)
    for t, results in recorded_ticks(trace):
        monitor.feed(results, t)
    workload = build_workload([w.session for w in monitor.windows], monitor.urls, "vllm")
    # vLLM's bench client: 64 requests in 34.3 s (1.87/s); the watch: 52 s, the first 20 s idle
    assert len(workload.lines) == 64 and workload.rate == pytest.approx(64 / 34.3, rel=0.05)
