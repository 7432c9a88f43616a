"""NVIDIA NIM for LLMs: unprefixed names (its Observability page), told apart by the few that no other
family (nor a process collector) exposes bare. It passes its engine's options through (vLLM's or
TensorRT-LLM's), so the verdict's "try" uses the generic words."""

from batchtop.core_engine.attach.servers.family import MetricNames, ServerFamily

NIM = "nim"
NAMES = MetricNames(
    running="num_requests_running", waiting="num_requests_waiting", kv_usage="gpu_cache_usage_perc",
    prompt_tokens="prompt_tokens_total", generation_tokens="generation_tokens_total",
    ttft="time_to_first_token_seconds", itl=("time_per_output_token_seconds",),
    e2e="e2e_request_latency_seconds", success="request_success_total", failures="request_failure_total",
    prompt_len="request_prompt_tokens", generation_len="request_generation_tokens", ceiling="num_request_max")

FAMILY = ServerFamily(
    name=NIM, label="NIM", documented="NIM for LLMs' Observability page", names=NAMES,
    markers=frozenset({"num_requests_running", "num_requests_waiting", "gpu_cache_usage_perc", "num_request_max"}),
    gaps={"waiting_reasons": "NIM gives no waiting reasons", "preemptions": "NIM exposes no preemption counter",
          "steps": "NIM exposes no per-step token histogram"})
