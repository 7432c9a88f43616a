"""Which server wrote an exposition, and the metric names each one uses for the same quantities.

vLLM (the `vllm:` names), SGLang (`sglang:`, as its Production Metrics page documents them) and
batchtop serve (vLLM's names plus its own `batchtop:` knobs). A name a flavour lacks is None: the
panel that needs it says "not exposed".
"""

from __future__ import annotations

from dataclasses import dataclass

VLLM, SGLANG, BATCHTOP = "vllm", "sglang", "batchtop"


@dataclass(frozen=True, slots=True)
class MetricNames:
    running: str
    waiting: str
    kv_usage: str  # a 0..1 share of the KV pool
    prompt_tokens: str
    generation_tokens: str
    ttft: str
    itl: tuple[str, ...]  # the first one exposed wins (SGLang renamed its ITL histogram)
    e2e: str
    queue_time: str
    waiting_by_reason: str | None = None
    preemptions: str | None = None
    success: str | None = None  # a counter labelled finished_reason
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

SGLANG_NAMES = MetricNames(
    running="sglang:num_running_reqs", waiting="sglang:num_queue_reqs", kv_usage="sglang:token_usage",
    prompt_tokens="sglang:prompt_tokens_total", generation_tokens="sglang:generation_tokens_total",
    ttft="sglang:time_to_first_token_seconds",
    itl=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    e2e="sglang:e2e_request_latency_seconds", queue_time="sglang:queue_time_seconds",
    kv_capacity_tokens="sglang:max_total_num_tokens")

NAMES = {VLLM: VLLM_NAMES, SGLANG: SGLANG_NAMES, BATCHTOP: VLLM_NAMES}
BATCHTOP_MAX_NUM_SEQS = "batchtop:max_num_seqs"
BATCHTOP_MODE = "batchtop:mode"


def detect_flavour(sample_names: set[str]) -> str | None:
    """The server behind these names; None when it is none of the three."""
    prefixes = {name.split(":", 1)[0] for name in sample_names if ":" in name}
    if "batchtop" in prefixes and "vllm" in prefixes:
        return BATCHTOP
    if "vllm" in prefixes:
        return VLLM
    if "sglang" in prefixes:
        return SGLANG
    return None
