"""LMDeploy: `lmdeploy:` names (lmdeploy/metrics/loggers.py)."""

from batchtop.core_engine.attach.servers.family import Knobs, MetricNames, ServerFamily

LMDEPLOY = "lmdeploy"
NAMES = MetricNames(
    running="lmdeploy:num_requests_running", waiting="lmdeploy:num_requests_waiting",
    kv_usage="lmdeploy:gpu_cache_usage_perc", prompt_tokens="lmdeploy:prompt_tokens_total",
    generation_tokens="lmdeploy:generation_tokens_total", ttft="lmdeploy:time_to_first_token_seconds",
    itl=("lmdeploy:iter_token_latency", "lmdeploy:time_per_output_token_seconds"),
    e2e="lmdeploy:e2e_request_latency_seconds", queue_time="lmdeploy:request_queue_time_seconds",
    success="lmdeploy:request_success_total", iteration_tokens="lmdeploy:iteration_tokens_total",
    prompt_len="lmdeploy:request_prompt_tokens", generation_len="lmdeploy:request_generation_tokens")

FAMILY = ServerFamily(
    name=LMDEPLOY, label="LMDeploy", documented="LMDeploy's lmdeploy/metrics/loggers.py", names=NAMES,
    prefix="lmdeploy:",
    gaps={"ceiling": "LMDeploy does not export max_batch_size",
          "waiting_reasons": "LMDeploy gives no waiting reasons",
          "preemptions": "LMDeploy exposes no preemption counter"},
    knobs=Knobs("--max-batch-size", "--max-prefill-token-num", "a higher --cache-max-entry-count or --quant-policy 8"))
