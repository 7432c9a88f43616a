"""/metrics: the engine's snapshots as Prometheus metrics under vLLM's own names, meanings and buckets.

Anything that reads a vLLM server (Grafana dashboards, vllm-top-style monitors, `batchtop attach`)
reads batchtop the same way. Fed on the engine thread, one snapshot at a time, from its Session; the
counters are the engine's own Counters, so they always agree with its metrics JSON.
"""

from __future__ import annotations

from prometheus_client import (CollectorRegistry, Counter, Gauge, GCCollector, Histogram, PlatformCollector,
                               ProcessCollector, generate_latest)

from batchtop.core_engine.config import MODES, EngineConfig
from batchtop.core_engine.engine.snapshot import Counters, StepSnapshot

# vLLM 0.32's buckets (vllm/v1/metrics/loggers.py), so histograms merge with a vLLM fleet's
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DELIVERY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
FINISH_REASONS = ("stop", "length", "abort", "error")


def request_token_buckets(max_model_len: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to max_model_len: vLLM's buckets for the per-request token counts."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


def num_running(snap: StepSnapshot) -> int:
    """Requests running once the step is over (the slots describe that moment: finished ones are FINISHED)."""
    return snap.num_running


class VllmMetrics:
    """A Session listener that keeps a CollectorRegistry of vLLM-named metrics (one per server)."""

    def __init__(self, config: EngineConfig, model_name: str) -> None:
        self.registry = r = CollectorRegistry()
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=r)
        names = ["model_name", "engine"]
        ids = (model_name, "0")

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=r).labels(*ids)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=r).labels(*ids)

        def histogram(name: str, doc: str, buckets: tuple) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=r).labels(*ids)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.prompt_tokens_cached = counter("vllm:prompt_tokens_cached",
                                            "Number of cached prompt tokens (local prefix cache hits).")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          [*names, "finished_reason"], registry=r)
        self.success = {reason: success.labels(*ids, reason) for reason in FINISH_REASONS}
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds",
                                    "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.iteration_tokens = histogram("vllm:iteration_tokens_total",
                                          "Histogram of number of tokens per engine_step.", ITERATION_TOKEN_BUCKETS)
        lengths = request_token_buckets(config.max_model_len)
        self.prompt_len = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", lengths)
        self.generation_len = histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                        lengths)
        self.flops = counter("vllm:estimated_flops_per_gpu", "Estimated number of floating point operations per "
                                                             "GPU (for Model Flops Utilization calculations).")
        self.read_bytes = counter("vllm:estimated_read_bytes_per_gpu", "Estimated number of bytes read from memory "
                                  "per GPU (for Model Flops Utilization calculations).")
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
              ["block_size", "num_gpu_blocks", "cache_dtype", "enable_prefix_caching", "engine"],
              registry=r).labels(str(config.block_size), str(config.num_kv_blocks), config.dtype,
                                 str(config.enable_prefix_caching), "0").set(1)
        self.max_num_seqs = Gauge("batchtop:max_num_seqs", "Slots: the most sequences that may run at once.",
                                  names, registry=r).labels(*ids)
        self.max_num_batched_tokens = Gauge("batchtop:max_num_batched_tokens", "Token budget of one engine step.",
                                            names, registry=r).labels(*ids)
        mode = Gauge("batchtop:mode", "Batching policy in force: 1 for the current mode, 0 for the other.",
                     [*names, "mode"], registry=r)
        self.mode = {m: mode.labels(*ids, m) for m in MODES}
        self.delivery = histogram("batchtop:token_delivery_seconds",
                                  "From the end of the engine step that made a token to its stream handler.",
                                  DELIVERY_BUCKETS)
        self._set_knobs(config.mode, config.max_num_seqs, config.max_num_batched_tokens)
        self._counters = Counters()
        self._arrival: dict[str, float] = {}  # run time each live request arrived
        self._queued: dict[str, float] = {}  # its time in the queue before first admission
        self._last_token: dict[str, float] = {}  # run time of its newest token
        self._stop_strings: set[str] = set()  # ended by a stop string: the engine sees an abort, vLLM counts a stop

    def stopped_by_string(self, request_id: str) -> None:
        """Thread-safe: the server cut this request at a stop string and is about to abort it."""
        self._stop_strings.add(request_id)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def _set_knobs(self, mode: str, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.max_num_seqs.set(max_num_seqs)
        self.max_num_batched_tokens.set(max_num_batched_tokens)
        for m, g in self.mode.items():
            g.set(1 if m == mode else 0)

    # -- Session listener (engine thread) -------------------------------------------------------
    def observe(self, snap: StepSnapshot) -> None:
        if any(name == "reset" for name, _ in snap.controls):
            # a fresh run: the engine's counters restart at 0, Prometheus counters count on from here
            self._counters = Counters()
            self._arrival.clear()
            self._queued.clear()
            self._last_token.clear()
            self._stop_strings.clear()
        self._set_knobs(snap.mode, snap.max_num_seqs, snap.max_num_batched_tokens)
        self.running.set(num_running(snap))
        self.waiting.set(snap.num_waiting)
        self.kv_usage.set(snap.num_used_blocks / snap.num_blocks if snap.num_blocks else 0.0)
        self._count(snap.counters)
        for view in snap.arrived:
            self._arrival[view.request_id] = view.arrival_s
        for name, value in snap.controls:
            if name == "abort":
                self.success["stop" if value in self._stop_strings else "abort"].inc()
                self._forget(str(value))
        if snap.is_step:
            self._observe_step(snap)

    def _observe_step(self, snap: StepSnapshot) -> None:
        self.iteration_tokens.observe(snap.num_tokens)
        self.flops.inc(snap.cost.flops)
        self.read_bytes.inc(snap.cost.bytes)
        step_start = snap.t - snap.step_time_s
        for rid in snap.admitted:
            if rid in self._arrival and rid not in self._queued:  # a preempted request waits only once
                self._queued[rid] = step_start - self._arrival[rid]
        for rid, _ in snap.new_tokens:
            previous = self._last_token.get(rid)
            if previous is None:
                self.ttft.observe(snap.t - self._arrival.get(rid, snap.t))
            else:
                self.itl.observe(snap.t - previous)
            self._last_token[rid] = snap.t
        for f in snap.finished:
            self.success[f.finish_reason].inc()
            self.prompt_len.observe(f.prompt_len)
            self.generation_len.observe(f.num_generated)
            self.e2e.observe(f.e2e_s)
            self.queue_time.observe(self._queued.get(f.request_id, 0.0))
            self._forget(f.request_id)

    def _count(self, now: Counters) -> None:
        before, self._counters = self._counters, now
        self.prompt_tokens.inc(now.prompt_tokens - before.prompt_tokens)
        self.generation_tokens.inc(now.generated_tokens - before.generated_tokens)
        self.preemptions.inc(now.preemptions - before.preemptions)
        self.prefix_queries.inc(now.prefix_queries - before.prefix_queries)
        self.prefix_hits.inc(now.prefix_hits - before.prefix_hits)
        self.prompt_tokens_cached.inc(now.prefix_hits - before.prefix_hits)  # new requests' prompt tokens found

    def _forget(self, request_id: str) -> None:
        self._arrival.pop(request_id, None)
        self._queued.pop(request_id, None)
        self._last_token.pop(request_id, None)
        self._stop_strings.discard(request_id)

    def closed(self, reason: str, error: str | None) -> None:
        if error is not None:  # every request still live failed with the engine
            self.success["error"].inc(len(self._arrival))
