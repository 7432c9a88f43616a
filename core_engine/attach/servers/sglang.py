"""SGLang: `sglang:` names (its Production Metrics page)."""

from batchtop.core_engine.attach.servers.family import Knobs, MetricNames, ServerFamily

SGLANG = "sglang"
NAMES = MetricNames(
    running="sglang:num_running_reqs", waiting="sglang:num_queue_reqs", kv_usage="sglang:token_usage",
    prompt_tokens="sglang:prompt_tokens_total", generation_tokens="sglang:generation_tokens_total",
    ttft="sglang:time_to_first_token_seconds",
    itl=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    e2e="sglang:e2e_request_latency_seconds", queue_time="sglang:queue_time_seconds",
    kv_capacity_tokens="sglang:max_total_num_tokens")

FAMILY = ServerFamily(
    name=SGLANG, label="SGLang", documented="SGLang's Production Metrics page", names=NAMES, prefix="sglang:",
    gaps={"ceiling": "SGLang does not export max_running_requests",
          "waiting_reasons": "SGLang gives no waiting reasons",
          "preemptions": "SGLang exposes no preemption counter",
          "steps": "SGLang exposes no per-step token histogram",
          "finished": "SGLang exposes no finished-request counter",
          "lengths": "SGLang exposes no per-request length histograms"},
    knobs=Knobs("--max-running-requests", "--chunked-prefill-size",
                "a higher --mem-fraction-static or --kv-cache-dtype fp8_e5m2"))
