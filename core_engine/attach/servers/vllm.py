"""vLLM: `vllm:` names (its metrics docs). It does not export max_num_seqs: the verdict infers the
ceiling from the plateau, or takes --max-num-seqs."""

from batchtop.core_engine.attach.servers.family import Knobs, MetricNames, ServerFamily

VLLM = "vllm"
NAMES = MetricNames(
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

FAMILY = ServerFamily(
    name=VLLM, label="vLLM", documented="vLLM's metrics docs", names=NAMES, prefix="vllm:",
    gaps={"ceiling": "vLLM does not export max_num_seqs"},
    knobs=Knobs("--max-num-seqs", "--max-num-batched-tokens",
                "--kv-cache-dtype fp8, a shorter --max-model-len or a higher --gpu-memory-utilization"))
