"""attach against a real `batchtop serve` (tiny preset, in-process, ephemeral port) running a workload:
it sees the requests run, the tokens advance, and percentiles that agree with the engine's own
metrics within the resolution of the histogram buckets, a roofline estimate from the token rates
near the engine's own FLOP/byte counters; a recording replays to the same numbers."""

from __future__ import annotations

import dataclasses
import json
import time

from click.testing import CliRunner

from batchtop.core_engine.attach.monitor import Monitor
from batchtop.core_engine.attach.scrape.poller import LivePoller
from batchtop.core_engine.attach.record.record import AttachRecorder, attach_header
from batchtop.core_engine.attach.server_point import ModelEstimate, estimated_point, measured_point
from batchtop.core_engine.attach.scrape.scrape import LIVE
from batchtop.core_engine.perf.metrics import MetricsCollector, percentiles
from batchtop.tui.cli import main
from tests.conftest import make_requests, tiny_config
from tests.support.serving import serving, wait_idle


class EngineMetrics(MetricsCollector):
    """The engine's own metrics, as a Session listener."""

    def closed(self, reason: str, error: str | None) -> None:
        pass


def estimate_beside_measured(monitor: Monitor, estimate: ModelEstimate) -> tuple[float, float] | None:
    """(estimated / measured intensity, and FLOP/s) for the newest interval with enough steps to judge."""
    window = monitor.windows[0]
    d = window.interval()
    steps = d.histograms.get("iteration_tokens") if d is not None else None
    if steps is None or steps.count < 10:
        return None
    measured, _ = measured_point(d)
    guess = estimated_point(d, estimate, window.latest.running, window.latest.histograms)
    return guess.intensity / measured.intensity, guess.flops_per_s / measured.flops_per_s


def same_or_next_bucket(hist, exact: float, estimate: float) -> bool:
    bounds = list(hist.bounds)
    i, j = bounds.index(hist.bucket_of(exact)[1]), bounds.index(hist.bucket_of(estimate)[1])
    return abs(i - j) <= 1  # interpolation rules differ; a bucket apart at most


def test_attach_follows_a_busy_batchtop_server_and_agrees_with_the_engine(tmp_path):
    # 48 arrivals in 0.1 s: faster than 4 slots of the tiny model serve them on any host, so a queue forms
    workload = [dataclasses.replace(r, arrival_s=0.3 + 0.002 * i)
                for i, r in enumerate(make_requests(48, seed=5, prompt=(4, 24), output=(24, 64)))]
    collector = EngineMetrics()
    config = tiny_config(max_num_seqs=4, num_kv_blocks=256)
    estimate, estimates = ModelEstimate(config.model, config.dtype), []
    trace = tmp_path / "attach.jsonl"
    with serving(config, workload=workload) as server:
        server.loop.session.listeners.append(collector)  # before the first arrival at 0.3 s
        poller = LivePoller([server.url], interval_s=0.1, timeout_s=2.0)
        monitor = Monitor([server.url], window_s=600)
        recorder = AttachRecorder(str(trace), attach_header([server.url], 0.1, 600, None, None, None))
        frames = []
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                results, t = poller.poll()
                frames.append(monitor.feed(results, t))
                recorder.tick(frames[-1].tick, t, results)
                estimates.append(estimate_beside_measured(monitor, estimate))
                if server.engine.is_done() and server.engine.counters.completed == len(workload) \
                        and frames[-1].replicas[0].running == 0 and len(frames) > 3:
                    break
                time.sleep(0.05)
            wait_idle(server)
            results, t = poller.poll()  # one scrape after the last finish
            frames.append(monitor.feed(results, t))
            recorder.tick(frames[-1].tick, t, results)
        finally:
            poller.close()
            recorder.close(frames[-1].t if frames else 0.0)
        counters = server.engine.counters
    stats = [f.replicas[0] for f in frames]
    assert all(s.status == LIVE and s.flavour == "batchtop" for s in stats)
    assert max(s.running for s in stats) > 0 and stats[0].max_num_seqs == 4
    assert max(s.running for s in stats) <= 4 and max(s.waiting for s in stats) > 0
    generated = [s.rates.get("generation_tokens", 0) for s in stats]
    assert max(generated) > 0 and min(generated) >= 0
    final = stats[-1]
    # the window spans the whole run: its deltas are the engine's own counters
    window = monitor.windows[0].window()
    assert window.totals["generation_tokens"] == counters.generated_tokens
    assert window.totals["prompt_tokens"] == counters.prompt_tokens
    assert sum(final.finished.values()) == len(workload) and final.success_rate == 1.0
    assert final.point is None or final.point.source == "measured"
    assert any(s.point is not None and s.point.source == "measured" and s.point.intensity > 0 for s in stats)
    # the estimate a server without FLOP counters gets (token rates x step_cost) lands near the
    # engine's own counted FLOPs and bytes: what --model promises for vLLM without --enable-mfu-metrics
    ratios = [r for r in estimates if r is not None]
    assert len(ratios) >= 3
    for intensity, flops in ratios:
        assert 0.6 < intensity < 1.6 and 0.6 < flops < 1.6, ratios
    assert 0.8 < sorted(i for i, _ in ratios)[len(ratios) // 2] < 1.25, ratios
    exact_ttft = [f.ttft_s for f in collector.finished]
    exact_e2e = [f.e2e_s for f in collector.finished]
    assert len(exact_ttft) == len(workload)
    for name, values in (("ttft", exact_ttft), ("e2e", exact_e2e)):
        hist = window.histograms[name]
        assert hist.count == len(workload)
        want = percentiles(values, (50, 99))
        for q, key in ((0.50, "p50"), (0.99, "p99")):
            got = final.latency[name][key]
            assert same_or_next_bucket(hist, want[key], got), (name, key, want[key], got, hist)

    result = CliRunner().invoke(main, ["replay", str(trace), "--headless", "-o", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    replayed = json.loads((tmp_path / "r.json").read_text())
    assert replayed["schema"] == "batchtop.attach/1" and replayed["replayed_from"] == str(trace)
    r = replayed["replicas"][0]
    assert r["latency_s"]["ttft"]["p50"] == final.latency["ttft"]["p50"]
    assert r["window_rates_per_s"]["generation_tokens"] == final.window_rates["generation_tokens"]
    assert r["finished"] == final.finished and replayed["ticks"] == len(frames)
