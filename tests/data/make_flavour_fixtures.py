"""Writes the attach fixtures of the servers batchtop has no capture of: TGI, llama.cpp (its /metrics
and /slots), LMDeploy, NIM and TensorRT-LLM's trtllm-serve. Each is two scrapes 2 s apart of one busy
server, under the names, types, labels and buckets its project defines (tests/data/README.md says
where each comes from). Run from the repository root: `python tests/data/make_flavour_fixtures.py`.

The text formats are each server's own: TGI's Rust exporter (metrics-exporter-prometheus: counters
without _total, a blank line between families), llama.cpp's hand-written HELP/TYPE/value triples,
and prometheus_client (which LMDeploy and NIM use) for the other two.
"""

from __future__ import annotations

import json
from pathlib import Path

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

HERE = Path(__file__).resolve().parent
REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0, 160.0, 640.0, 2560.0)
TPOT = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0)
ITERATION = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def buckets_1_2_5(top: int) -> list[int]:
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > top:
                return out
            out.append(m * scale)
        scale *= 10


# --- TGI: router/src/server.rs (bucket rules), docs/source/reference/metrics.md (names) -------------
TGI_DURATION = [0.0001 * 1.5 ** (i + 1) for i in range(35)]  # geometric from 0.00015 by 1.5, 35 buckets


def _rust_histogram(name: str, bounds: list[float], values: list[float], labels: str = "") -> list[str]:
    sep = "," if labels else ""
    lines = [f"# TYPE {name} histogram"]
    for b in bounds:
        lines.append(f'{name}_bucket{{{labels}{sep}le="{b:g}"}} {sum(v <= b for v in values)}')
    lines.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {len(values)}')
    suffix = f"{{{labels}}}" if labels else ""
    lines += [f"{name}_sum{suffix} {sum(values):g}", f"{name}_count{suffix} {len(values)}", ""]
    return lines


def tgi(done: int, batch: int, queue: int) -> str:
    max_input, max_total = 4096, 8192
    inputs = [float(200 + 40 * (i % 9)) for i in range(done + batch + queue)]  # validated on arrival
    outputs = [float(256 + 16 * (i % 5)) for i in range(done)]  # observed as each finishes
    lines = ["# TYPE tgi_batch_current_size gauge", f"tgi_batch_current_size {batch}", "",
             "# TYPE tgi_queue_size gauge", f"tgi_queue_size {queue}", "",
             "# TYPE tgi_batch_current_max_tokens gauge", f"tgi_batch_current_max_tokens {batch * 700}", "",
             "# TYPE tgi_request_count counter", f"tgi_request_count {done + batch + queue + 2}", "",
             "# TYPE tgi_request_success counter", f"tgi_request_success {done}", "",
             "# TYPE tgi_request_failure counter", 'tgi_request_failure{err="validation"} 2', ""]
    lines += _rust_histogram("tgi_request_input_length", [max_input / 100 * (x + 1) for x in range(100)], inputs)
    lines += _rust_histogram("tgi_request_generated_tokens", [max_total / 100 * (x + 1) for x in range(100)], outputs)
    lines += _rust_histogram("tgi_request_duration", TGI_DURATION, [6.0 + (i % 4) for i in range(done)])
    lines += _rust_histogram("tgi_request_queue_duration", TGI_DURATION, [0.4 + 0.1 * (i % 3) for i in range(done)])
    lines += _rust_histogram("tgi_request_mean_time_per_token_duration", TGI_DURATION, [0.021] * done)
    lines += _rust_histogram("tgi_batch_next_size", [float(x + 1) for x in range(32)], [float(batch)] * (done // 4))
    return "\n".join(lines) + "\n"


# --- llama.cpp: tools/server/README.md, "GET /metrics" and "GET /slots" ------------------------------
def llamacpp(prompt: int, predicted: int, decodes: int, processing: int, deferred: int) -> str:
    metrics = [
        ("counter", "prompt_tokens_total", "Number of prompt tokens processed.", prompt),
        ("counter", "prompt_seconds_total", "Prompt process time", prompt / 900),
        ("counter", "tokens_predicted_total", "Number of generation tokens processed.", predicted),
        ("counter", "tokens_predicted_seconds_total", "Predict process time", predicted / 41),
        ("counter", "n_decode_total", "Total number of llama_decode() calls", decodes),
        ("counter", "n_tokens_max", "Largest observed n_tokens.", 1024),
        ("gauge", "n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call", 3.6),
        ("gauge", "prompt_tokens_seconds", "Average prompt throughput in tokens/s.", 900.0),
        ("gauge", "predicted_tokens_seconds", "Average generation throughput in tokens/s.", 41.0),
        ("gauge", "requests_processing", "Number of requests processing.", processing),
        ("gauge", "requests_deferred", "Number of requests deferred.", deferred),
    ]
    return "".join(f"# HELP llamacpp:{n} {h}\n# TYPE llamacpp:{n} {t}\nllamacpp:{n} {v:g}\n" for t, n, h, v in metrics)


def llamacpp_slots(busy: int, total: int) -> list[dict]:
    return [{"id": i, "id_task": 100 + i if i < busy else -1, "n_ctx": 4096, "speculative": False,
             "is_processing": i < busy, "params": {"n_predict": -1, "temperature": 0.8, "max_tokens": -1},
             "next_token": {"has_next_token": True, "has_new_line": False, "n_remain": -1,
                            "n_decoded": 40 * (i + 1) if i < busy else 0}} for i in range(total)]


# --- LMDeploy: lmdeploy/metrics/loggers.py (PrometheusStatLogger) ------------------------------------
def lmdeploy(done: int, running: int, waiting: int, kv: float, steps: int) -> str:
    r = CollectorRegistry()
    names, ids = ["model_name", "engine"], ("internlm2_5-7b-chat", "0")
    Gauge("lmdeploy:num_requests_running", "running", names, registry=r).labels(*ids).set(running)
    Gauge("lmdeploy:num_requests_waiting", "waiting", names, registry=r).labels(*ids).set(waiting)
    Gauge("lmdeploy:gpu_cache_usage_perc", "kv", names, registry=r).labels(*ids).set(kv)
    Counter("lmdeploy:prompt_tokens", "p", names, registry=r).labels(*ids).inc(done * 512)
    Counter("lmdeploy:generation_tokens", "g", names, registry=r).labels(*ids).inc(steps * running)
    success = Counter("lmdeploy:request_success", "ok", names + ["finished_reason"], registry=r)
    success.labels(*ids, "ResponseType.FINISH").inc(done)
    success.labels(*ids, "ResponseType.CANCEL").inc(1)
    hist = lambda name, b: Histogram(name, name, names, buckets=b, registry=r).labels(*ids)  # noqa: E731
    lens, outs, it = hist("lmdeploy:request_prompt_tokens", buckets_1_2_5(32768)), \
        hist("lmdeploy:request_generation_tokens", buckets_1_2_5(32768)), hist("lmdeploy:iteration_tokens_total", ITERATION)
    ttft, e2e = hist("lmdeploy:time_to_first_token_seconds", TTFT), hist("lmdeploy:e2e_request_latency_seconds", REQUEST_LATENCY)
    hist("lmdeploy:time_per_output_token_seconds", TPOT).observe(0.03)
    queue = hist("lmdeploy:request_queue_time_seconds", REQUEST_LATENCY)
    for i in range(done):
        lens.observe(512)
        outs.observe(300 + i % 7)
        ttft.observe(0.2)
        e2e.observe(9.0)
        queue.observe(0.6)
    for _ in range(steps):
        it.observe(running)
    return generate_latest(r).decode()


# --- NIM for LLMs: its Observability page (docs.nvidia.com/nim/large-language-models/latest/observability.html)
def nim(done: int, running: int, waiting: int, kv: float, generated: int) -> str:
    r = CollectorRegistry()
    names, ids = ["model_name"], ("meta/llama-3.1-8b-instruct",)
    for name, value in (("num_requests_running", running), ("num_requests_waiting", waiting),
                        ("num_request_max", 256), ("gpu_cache_usage_perc", kv)):
        Gauge(name, name, names, registry=r).labels(*ids).set(value)
    Counter("prompt_tokens", "p", names, registry=r).labels(*ids).inc(done * 1000)
    Counter("generation_tokens", "g", names, registry=r).labels(*ids).inc(generated)
    Counter("request_success", "ok", names, registry=r).labels(*ids).inc(done)
    Counter("request_failure", "failed", names, registry=r).labels(*ids).inc(1)
    hist = lambda name, b: Histogram(name, name, names, buckets=b, registry=r).labels(*ids)  # noqa: E731
    lens, outs = hist("request_prompt_tokens", buckets_1_2_5(8192)), hist("request_generation_tokens", buckets_1_2_5(8192))
    ttft, tpot = hist("time_to_first_token_seconds", TTFT), hist("time_per_output_token_seconds", TPOT)
    e2e = hist("e2e_request_latency_seconds", REQUEST_LATENCY)
    for i in range(done):
        lens.observe(1000)
        outs.observe(150 + i % 3)
        ttft.observe(0.08)
        tpot.observe(0.012)
        e2e.observe(2.0)
    return generate_latest(r).decode()


# --- trtllm-serve: cpp/tensorrt_llm/executor/jsonSerialization.cpp (IterationStats) -------------------
def trtllm(first_iter: int, n: int, active: int, queued: int, completed_every: int) -> list[dict]:
    out = []
    for i in range(first_iter, first_iter + n):
        out.append({
            "timestamp": f"03-02-2026 10:00:{i % 60:02d}", "iter": i, "iterLatencyMS": 21.5,
            "newActiveRequestsQueueLatencyMS": 0.4, "numNewActiveRequests": 0, "numActiveRequests": active,
            "numQueuedRequests": queued, "numCompletedRequests": 1 if i % completed_every == 0 else 0,
            "maxNumActiveRequests": 64, "maxBatchSizeStatic": 64, "maxBatchSizeTunerRecommended": 64,
            "maxBatchSizeRuntime": 64, "maxNumTokensStatic": 8192, "maxNumTokensTunerRecommended": 8192,
            "maxNumTokensRuntime": 8192, "gpuMemUsage": 60_000_000_000, "cpuMemUsage": 0, "pinnedMemUsage": 0,
            "kvCacheStats": {"maxNumBlocks": 4096, "freeNumBlocks": 1024, "usedNumBlocks": 3072, "tokensPerBlock": 32,
                             "allocTotalBlocks": 3072, "allocNewBlocks": 8, "reusedBlocks": 0, "missedBlocks": 8,
                             "cacheHitRate": 0.0},
            "staticBatchingStats": None,
            "inflightBatchingStats": {"numScheduledRequests": active, "numContextRequests": 1, "numGenRequests": active - 1,
                                      "numPausedRequests": 0, "numCtxTokens": 8192 - (active - 1), "microBatchId": 0,
                                      "avgNumDecodedTokensPerIter": 1.0},
            "specDecodingStats": None,
        })
    return out


def main() -> None:
    prometheus_client.disable_created_metrics()  # as LMDeploy does; and no timestamps: the files stay the same
    write = lambda name, text: (HERE / name).write_text(text, encoding="utf-8")  # noqa: E731
    write("tgi-3.3-a.prom", tgi(done=100, batch=12, queue=5))
    write("tgi-3.3-b.prom", tgi(done=110, batch=12, queue=7))
    write("llamacpp-a.prom", llamacpp(prompt=20480, predicted=6000, decodes=1600, processing=4, deferred=3))
    write("llamacpp-b.prom", llamacpp(prompt=20992, predicted=6330, decodes=1690, processing=4, deferred=5))
    write("llamacpp-slots.json", json.dumps(llamacpp_slots(busy=4, total=4), indent=1) + "\n")
    write("lmdeploy-a.prom", lmdeploy(done=40, running=16, waiting=9, kv=0.62, steps=900))
    write("lmdeploy-b.prom", lmdeploy(done=46, running=16, waiting=11, kv=0.64, steps=1000))
    write("nim-a.prom", nim(done=300, running=40, waiting=0, kv=0.35, generated=45000))
    write("nim-b.prom", nim(done=306, running=38, waiting=0, kv=0.34, generated=48000))
    write("trtllm-a.json", json.dumps(trtllm(1, 40, active=10, queued=22, completed_every=8), indent=1) + "\n")
    write("trtllm-b.json", json.dumps(trtllm(41, 40, active=10, queued=24, completed_every=8), indent=1) + "\n")


if __name__ == "__main__":
    main()
