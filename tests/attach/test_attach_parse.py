"""attach over real vLLM 0.32 expositions (captured from its CPU server under load) and SGLang's names:
flavour, rates, windowed percentiles from bucket deltas, the roofline point, replicas merged."""

from __future__ import annotations

import dataclasses

import pytest

from batchtop.core_engine.attach.servers.batchtop import BATCHTOP
from batchtop.core_engine.attach.servers.sglang import SGLANG
from batchtop.core_engine.attach.servers.vllm import VLLM
from batchtop.core_engine.attach.scrape.histogram import Histogram, merge_all
from batchtop.core_engine.attach.monitor import Monitor
from batchtop.core_engine.attach.server_point import ModelEstimate
from batchtop.core_engine.attach.scrape.sample import BadExposition, parse_exposition
from batchtop.core_engine.config import preset
from batchtop.core_engine.perf.device_peaks import datasheet_peaks
from tests.support.attach_helpers import VLLM_IDLE, VLLM_T0, VLLM_T2, live, sglang_text, vllm_sample


def two_samples(monitor: Monitor, a, b, dt: float = 2.0):
    monitor.feed([live(vllm_sample(a, 0.0))], 0.0)
    return monitor.feed([live(dataclasses.replace(vllm_sample(b, dt)))], dt)


def test_a_vllm_capture_is_read_as_vllm_with_its_gauges_and_cache_config():
    s = vllm_sample(VLLM_T0, 0.0)
    assert s.flavour == VLLM and s.model_name == "tiny-llama"
    assert (s.running, s.waiting) == (8, 56)
    assert s.waiting_by_reason == {"capacity": 56, "deferred": 0}
    assert s.num_gpu_blocks == 8192 and s.block_size == 128
    assert s.kv_usage == pytest.approx(0.0068367720669026966)
    assert s.max_num_seqs is None  # vLLM does not expose it: the panels say "unknown"


def test_rates_percentiles_and_the_roofline_point_of_two_vllm_samples_2s_apart():
    frame = two_samples(Monitor(["vllm"]), VLLM_T0, VLLM_T2)
    s = frame.replicas[0]
    assert (s.running, s.waiting) == (8, 48)
    assert s.rates["generation_tokens"] == pytest.approx((12241 - 6497) / 2)
    assert s.rates["prompt_tokens"] == pytest.approx((768 - 384) / 2)
    assert s.rates["steps"] == pytest.approx((1531 - 813) / 2)
    assert s.tokens_per_step == pytest.approx((13009 - 6881) / (1531 - 813))
    # in these 2 s, 8 first tokens, all in the (2.5, 5.0] bucket: linear inside it
    ttft = s.latency["ttft"]
    assert ttft["count"] == 8
    assert ttft["p50"] == pytest.approx(2.5 + 2.5 * 0.5) and ttft["p99"] == pytest.approx(2.5 + 2.5 * 0.99)
    # ... while over the server's whole life the median sits among the fast first wave (<= 0.06 s)
    assert vllm_sample(VLLM_T2, 2.0).histograms["ttft"].quantile(0.5) <= 0.06
    assert s.latency["queue_time"]["p50"] == pytest.approx(0.15)  # 8 queue times in (0, 0.3]
    assert s.finished["length"] == 8 and s.success_rate == 1.0
    point = s.point
    assert point.source == "measured"
    assert point.intensity == pytest.approx((4.403220224e10 - 2.346833664e10) / (9.56918272e9 - 5.157103616e9))
    assert point.flops_per_s == pytest.approx((4.403220224e10 - 2.346833664e10) / 2)
    h100 = datasheet_peaks("H100")
    assert point.bound(h100) == "memory-bound" and point.fraction_of_roof(h100) < 0.01


def test_without_mfu_counters_the_point_is_missing_and_says_why_or_is_estimated_from_the_model():
    def no_mfu(path):
        text = path.read_text(encoding="utf-8")
        return "\n".join(line for line in text.splitlines() if "estimated_" not in line) + "\n"

    def zeroed(path):
        lines = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("vllm:estimated_") and "_total" in line:
                line = line.rsplit(" ", 1)[0] + " 0.0"
            lines.append(line)
        return "\n".join(lines) + "\n"

    for rewrite, note in ((no_mfu, "exposes no FLOP/byte counters"), (zeroed, "--enable-mfu-metrics")):
        m = Monitor(["vllm"])
        m.feed([live(parse_exposition(rewrite(VLLM_T0), 0.0))], 0.0)
        s = m.feed([live(parse_exposition(rewrite(VLLM_T2), 2.0))], 2.0).replicas[0]
        assert s.point is None and note in s.point_note

    estimate = ModelEstimate(preset("tiny"), "bfloat16")
    m = Monitor(["vllm"], estimate=estimate)
    m.feed([live(parse_exposition(zeroed(VLLM_T0), 0.0))], 0.0)
    s = m.feed([live(parse_exposition(zeroed(VLLM_T2), 2.0))], 2.0).replicas[0]
    assert s.point.source == "estimated" and "estimated" in s.point_note
    # decode-heavy steps of ~8 rows are far left of any GPU ridge
    assert 0 < s.point.intensity < 50 and s.point.flops_per_s > 0


def test_an_idle_server_has_no_rates_to_invent():
    m = Monitor(["vllm"])
    m.feed([live(vllm_sample(VLLM_IDLE, 0.0))], 0.0)
    s = m.feed([live(vllm_sample(VLLM_IDLE, 1.0))], 1.0).replicas[0]
    assert s.rates["generation_tokens"] == 0 and s.point is None and s.point_note.startswith("idle")
    assert "ttft" not in s.latency or s.latency["ttft"]["p50"] is None


def test_sglang_names_are_read_as_sglang():
    a = parse_exposition(sglang_text(3, 5, 0.4, 100, 1000, [0.15] * 4), 0.0)
    b = parse_exposition(sglang_text(4, 2, 0.5, 300, 1600, [0.15] * 4 + [1.0] * 6), 3.0)
    assert a.flavour == SGLANG and a.model_name == "meta-llama/Llama-3.1-8B-Instruct"
    assert (b.running, b.waiting, b.kv_usage) == (4, 2, 0.5)
    m = Monitor(["sglang"])
    m.feed([live(a)], 0.0)
    s = m.feed([live(b)], 3.0).replicas[0]
    assert s.rates["generation_tokens"] == pytest.approx(200) and s.rates["prompt_tokens"] == pytest.approx(200 / 3)
    assert 0.8 < s.latency["ttft"]["p50"] <= 1.6  # only the window's 6 new ones, all in (0.8, 1.6]
    assert s.point is None  # SGLang exposes no FLOP counters


def test_flavour_detection_and_what_is_not_a_server():
    assert parse_exposition('vllm:num_requests_running{engine="0"} 1\nvllm:num_requests_waiting{engine="0"} 0\n'
                            'batchtop:max_num_seqs 16\n', 0).flavour == BATCHTOP
    with pytest.raises(BadExposition, match="not Prometheus text"):
        parse_exposition("<html><body>Welcome to nginx!</body></html>", 0)
    with pytest.raises(BadExposition, match="no vLLM, SGLang, TGI, llama.cpp, LMDeploy, NIM or batchtop metrics"):
        parse_exposition("node_load1 0.5\n", 0)
    with pytest.raises(BadExposition, match="empty"):
        parse_exposition("", 0)


def test_quantiles_are_linear_inside_a_bucket_and_replicas_merge_buckets_not_percentiles():
    inf = float("inf")
    fast = Histogram((0.1, 1.0, 10.0, inf), (90, 100, 100, 100), 5.0, 100)  # 90 under 0.1 s
    slow = Histogram((0.1, 1.0, 10.0, inf), (0, 0, 10, 10), 50.0, 10)  # 10 in (1, 10]
    merged = merge_all([fast, slow])
    assert merged.count == 110
    # p99 of the merged fleet: rank 108.9 of 110 falls in (1, 10]: not the mean of the two p99s
    assert merged.quantile(0.99) == pytest.approx(1.0 + 9.0 * (108.9 - 100) / 10)
    assert merged.quantile(0.99) != pytest.approx((fast.quantile(0.99) + slow.quantile(0.99)) / 2)
    assert Histogram((1.0, inf), (0, 4), 0, 4).quantile(0.5) == 1.0  # the +Inf bucket: its lower bound
    assert Histogram((1.0, inf), (0, 0), 0, 0).quantile(0.5) is None
    assert slow.minus(fast) is None  # counts that went down: not a delta
    assert fast.minus(slow) is None  # a "delta" that is not cumulative spans a restart
    assert merge_all([fast, Histogram((0.5, inf), (1, 1), 0, 1)]) is None  # different buckets: no merge


def test_replicas_sum_gauges_and_rates_merge_buckets_and_name_the_outlier():
    m = Monitor(["a", "b", "c"])
    m.feed([live(vllm_sample(VLLM_T0, 0.0)), live(vllm_sample(VLLM_T0, 0.0)), live(vllm_sample(VLLM_IDLE, 0.0))], 0.0)
    frame = m.feed([live(vllm_sample(VLLM_T2, 2.0)), live(vllm_sample(VLLM_T2, 2.0)),
                    live(vllm_sample(VLLM_IDLE, 2.0))], 2.0)
    agg = frame.aggregate
    assert (agg.running, agg.waiting, agg.num_gpu_blocks) == (16, 96, 3 * 8192)
    assert agg.waiting_by_reason["capacity"] == 96
    assert agg.rates["generation_tokens"] == pytest.approx(2 * (12241 - 6497) / 2)
    assert agg.latency["ttft"]["count"] == 16 and agg.latency["ttft"]["p50"] == pytest.approx(3.75)
    # the KV share of the fleet is weighted by each pool: two busy pools and an empty one
    busy = vllm_sample(VLLM_T2, 2.0).kv_usage
    assert agg.kv_usage == pytest.approx(2 * busy / 3)
    assert agg.point.intensity == pytest.approx(frame.replicas[0].point.intensity)  # same work, same ratio
    assert agg.point.flops_per_s == pytest.approx(2 * frame.replicas[0].point.flops_per_s)
    found = {b.metric: b for b in frame.imbalances}
    assert found["waiting"].replica == 2 and found["waiting"].value == 0 and found["waiting"].mean == 32
    assert "imbalance: replica 2 (c) waiting 0 vs mean 32" == found["waiting"].line()
    balanced = Monitor(["a", "b"])
    balanced.feed([live(vllm_sample(VLLM_T0, 0.0))] * 2, 0.0)
    assert balanced.feed([live(vllm_sample(VLLM_T2, 2.0))] * 2, 2.0).imbalances == ()


def test_a_recording_header_keeps_the_model_of_an_estimate(tmp_path):
    from batchtop.core_engine.attach.record.record import AttachRecorder, attach_header, monitor_for, recorded_ticks
    from batchtop.core_engine.trace.trace import read_trace

    estimate = ModelEstimate(preset("cpu-demo"), "bfloat16")
    path = str(tmp_path / "est.jsonl")
    rec = AttachRecorder(path, attach_header(["vllm"], 2.0, 30.0, 16, estimate, None))
    rec.tick(1, 0.0, [live(vllm_sample(VLLM_T0, 0.0))])
    rec.tick(2, 2.0, [live(vllm_sample(VLLM_T2, 2.0))])
    rec.close(2.0)
    trace = read_trace(path)
    monitor = monitor_for(trace)
    assert monitor.estimate == estimate and monitor.max_num_seqs == 16
    ticks = list(recorded_ticks(trace))
    assert [t for t, _ in ticks] == [0.0, 2.0]
    live_frame = Monitor(["vllm"], max_num_seqs=16, estimate=estimate)
    for t, results in ticks:
        replayed = monitor.feed(results, t)
        direct = live_frame.feed([live(vllm_sample(VLLM_T0 if t == 0 else VLLM_T2, t))], t)
    assert replayed.replicas == direct.replicas
