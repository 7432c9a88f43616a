"""The servers attach reads, and the metric names each one uses for the same quantities.

vLLM (`vllm:`), SGLang (`sglang:`, its Production Metrics page), batchtop serve (vLLM's names plus
its own `batchtop:` knobs), Hugging Face TGI (`tgi_`, docs/source/reference/metrics.md), llama.cpp's
server (`llamacpp:`, tools/server/README.md), LMDeploy (`lmdeploy:`, lmdeploy/metrics/loggers.py) and
NVIDIA NIM for LLMs (unprefixed, its Observability page). TensorRT-LLM's `trtllm-serve` answers JSON
iteration stats instead (trtllm.py). A name a flavour lacks is None: the panel that needs it says so
(coverage.py says what each one cannot fill).
"""

from __future__ import annotations

from dataclasses import dataclass

VLLM, SGLANG, BATCHTOP, TGI, LLAMACPP, LMDEPLOY, NIM, TRTLLM = (
    "vllm", "sglang", "batchtop", "tgi", "llamacpp", "lmdeploy", "nim", "trtllm")
FLAVOURS = (VLLM, SGLANG, BATCHTOP, TGI, LLAMACPP, LMDEPLOY, NIM, TRTLLM)
LABELS = {VLLM: "vLLM", SGLANG: "SGLang", BATCHTOP: "batchtop serve", TGI: "TGI", LLAMACPP: "llama.cpp",
          LMDEPLOY: "LMDeploy", NIM: "NIM", TRTLLM: "TensorRT-LLM", "mixed": "mixed servers"}


@dataclass(frozen=True, slots=True)
class MetricNames:
    running: str
    waiting: str
    kv_usage: str | None = None  # a 0..1 share of the KV pool
    prompt_tokens: str | None = None  # counters
    generation_tokens: str | None = None
    ttft: str | None = None
    itl: tuple[str, ...] = ()  # the first one exposed wins (SGLang renamed its ITL histogram)
    e2e: str | None = None
    queue_time: str | None = None
    waiting_by_reason: str | None = None
    preemptions: str | None = None
    success: str | None = None  # a counter of finished requests, labelled finished_reason where it says it
    failures: str | None = None  # a counter of failed requests (counted as finished "error")
    iteration_tokens: str | None = None
    prompt_len: str | None = None  # per-request prompt length histogram
    generation_len: str | None = None
    flops: str | None = None
    read_bytes: str | None = None
    write_bytes: str | None = None
    cache_info: str | None = None  # an info gauge labelled num_gpu_blocks, block_size
    kv_capacity_tokens: str | None = None  # a gauge: the pool's size in tokens
    prefix_queries: str | None = None  # prefix-cache tokens looked up, and found cached (counters)
    prefix_hits: str | None = None
    ceiling: str | None = None  # a gauge: the most requests that may run at once
    token_budget: str | None = None  # a gauge: the most tokens one engine step may hold
    steps: str | None = None  # a counter of engine steps
    tokens_from_requests: bool = False  # no token counters: the per-request length histograms' sums instead


VLLM_NAMES = MetricNames(
    running="vllm:num_requests_running", waiting="vllm:num_requests_waiting",
    kv_usage="vllm:kv_cache_usage_perc", prompt_tokens="vllm:prompt_tokens_total",
    generation_tokens="vllm:generation_tokens_total", ttft="vllm:time_to_first_token_seconds",
    itl=("vllm:inter_token_latency_seconds",), e2e="vllm:e2e_request_latency_seconds",
    queue_time="vllm:request_queue_time_seconds", waiting_by_reason="vllm:num_requests_waiting_by_reason",
    preemptions="vllm:num_preemptions_total", success="vllm:request_success_total",
    iteration_tokens="vllm:iteration_tokens_total", prompt_len="vllm:request_prompt_tokens",
    generation_len="vllm:request_generation_tokens", flops="vllm:estimated_flops_per_gpu_total",
    read_bytes="vllm:estimated_read_bytes_per_gpu_total", write_bytes="vllm:estimated_write_bytes_per_gpu_total",
    cache_info="vllm:cache_config_info", prefix_queries="vllm:prefix_cache_queries_total",
    prefix_hits="vllm:prefix_cache_hits_total")

BATCHTOP_MAX_NUM_SEQS = "batchtop:max_num_seqs"
BATCHTOP_MAX_NUM_BATCHED_TOKENS = "batchtop:max_num_batched_tokens"
BATCHTOP_MODE = "batchtop:mode"
BATCHTOP_NAMES = MetricNames(**{k: getattr(VLLM_NAMES, k) for k in VLLM_NAMES.__slots__}
                             | {"ceiling": BATCHTOP_MAX_NUM_SEQS, "token_budget": BATCHTOP_MAX_NUM_BATCHED_TOKENS})

SGLANG_NAMES = MetricNames(
    running="sglang:num_running_reqs", waiting="sglang:num_queue_reqs", kv_usage="sglang:token_usage",
    prompt_tokens="sglang:prompt_tokens_total", generation_tokens="sglang:generation_tokens_total",
    ttft="sglang:time_to_first_token_seconds",
    itl=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    e2e="sglang:e2e_request_latency_seconds", queue_time="sglang:queue_time_seconds",
    kv_capacity_tokens="sglang:max_total_num_tokens")

# TGI's Rust exporter writes its counters without _total (tgi_request_success); prometheus_client's
# parser names every counter's sample with it, as it does for all counters
TGI_NAMES = MetricNames(
    running="tgi_batch_current_size", waiting="tgi_queue_size", itl=("tgi_request_mean_time_per_token_duration",),
    e2e="tgi_request_duration", queue_time="tgi_request_queue_duration", success="tgi_request_success_total",
    failures="tgi_request_failure_total", prompt_len="tgi_request_input_length",
    generation_len="tgi_request_generated_tokens", tokens_from_requests=True)

LLAMACPP_NAMES = MetricNames(
    running="llamacpp:requests_processing", waiting="llamacpp:requests_deferred",
    prompt_tokens="llamacpp:prompt_tokens_total", generation_tokens="llamacpp:tokens_predicted_total",
    steps="llamacpp:n_decode_total")

LMDEPLOY_NAMES = MetricNames(
    running="lmdeploy:num_requests_running", waiting="lmdeploy:num_requests_waiting",
    kv_usage="lmdeploy:gpu_cache_usage_perc", prompt_tokens="lmdeploy:prompt_tokens_total",
    generation_tokens="lmdeploy:generation_tokens_total", ttft="lmdeploy:time_to_first_token_seconds",
    itl=("lmdeploy:iter_token_latency", "lmdeploy:time_per_output_token_seconds"),
    e2e="lmdeploy:e2e_request_latency_seconds", queue_time="lmdeploy:request_queue_time_seconds",
    success="lmdeploy:request_success_total", iteration_tokens="lmdeploy:iteration_tokens_total",
    prompt_len="lmdeploy:request_prompt_tokens", generation_len="lmdeploy:request_generation_tokens")

NIM_NAMES = MetricNames(
    running="num_requests_running", waiting="num_requests_waiting", kv_usage="gpu_cache_usage_perc",
    prompt_tokens="prompt_tokens_total", generation_tokens="generation_tokens_total",
    ttft="time_to_first_token_seconds", itl=("time_per_output_token_seconds",),
    e2e="e2e_request_latency_seconds", success="request_success_total", failures="request_failure_total",
    prompt_len="request_prompt_tokens", generation_len="request_generation_tokens", ceiling="num_request_max")

NAMES = {VLLM: VLLM_NAMES, SGLANG: SGLANG_NAMES, BATCHTOP: BATCHTOP_NAMES, TGI: TGI_NAMES,
         LLAMACPP: LLAMACPP_NAMES, LMDEPLOY: LMDEPLOY_NAMES, NIM: NIM_NAMES}
PREFIXES = {"vllm": VLLM, "sglang": SGLANG, "llamacpp": LLAMACPP, "lmdeploy": LMDEPLOY}
# NIM's names carry no prefix; these are the ones no other flavour (nor a process collector) exposes bare
NIM_MARKERS = frozenset({"num_requests_running", "num_requests_waiting", "gpu_cache_usage_perc", "num_request_max"})


def flavour_of(name: str) -> str | None:
    """The flavour a sample name belongs to; "batchtop" for batchtop's own knobs; None for the rest
    (process_*, python_*, http_* and other collectors every server may carry)."""
    if ":" in name:
        prefix = name.split(":", 1)[0]
        return PREFIXES.get(prefix, BATCHTOP if prefix == "batchtop" else None)
    if name.startswith("tgi_"):
        return TGI
    return NIM if name in NIM_MARKERS else None


def flavours_in(sample_names: set[str]) -> dict[str, str]:
    """Each flavour found among the names (in FLAVOURS' order), with one of its names as the example:
    its running gauge where it has it."""
    found: dict[str, str] = {}
    for name in sorted(sample_names):
        flavour = flavour_of(name)
        if flavour is not None:
            running = NAMES[flavour].running if flavour in NAMES else None
            if flavour not in found or name == running:
                found[flavour] = name
    return {f: found[f] for f in FLAVOURS if f in found}


def detect_flavour(sample_names: set[str]) -> str | None:
    """The server behind these names; None when it is none of them. Several servers' names in one
    exposition raise ValueError naming two of them: one URL is one server."""
    found = flavours_in(sample_names)
    knobs = found.pop(BATCHTOP, None)
    if len(found) > 1:
        (a, name_a), (b, name_b) = list(found.items())[:2]
        raise ValueError(f"mixes {LABELS[a]} and {LABELS[b]} metrics ({name_a}, {name_b}): one server per URL")
    if knobs is not None and found and VLLM not in found:
        raise ValueError(f"batchtop's own metrics ({knobs}) beside {LABELS[next(iter(found))]}'s: "
                         "batchtop serve exposes vLLM's names")
    if not found:
        return None
    flavour = next(iter(found))
    return BATCHTOP if flavour == VLLM and knobs is not None else flavour
