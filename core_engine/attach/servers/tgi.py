"""Hugging Face TGI: `tgi_` names (its docs/source/reference/metrics.md). Its Rust exporter writes
counters without _total (tgi_request_success); prometheus_client's parser names every counter's sample
with it, as it does for all counters. No token counters: the per-request length histograms stand in."""

from batchtop.core_engine.attach.servers.family import Knobs, MetricNames, ServerFamily

TGI = "tgi"
NAMES = MetricNames(
    running="tgi_batch_current_size", waiting="tgi_queue_size", itl=("tgi_request_mean_time_per_token_duration",),
    e2e="tgi_request_duration", queue_time="tgi_request_queue_duration", success="tgi_request_success_total",
    failures="tgi_request_failure_total", prompt_len="tgi_request_input_length",
    generation_len="tgi_request_generated_tokens", tokens_from_requests=True)

FAMILY = ServerFamily(
    name=TGI, label="TGI", documented="TGI's docs/source/reference/metrics.md", names=NAMES, prefix="tgi_",
    gaps={"ceiling": "TGI does not export max_batch_size",
          "kv": "TGI exposes no KV usage (its budget, max_batch_total_tokens, is not exported)",
          "waiting_reasons": "TGI gives no waiting reasons",
          "preemptions": "TGI exposes no preemption counter",
          "ttft": "TGI exposes no TTFT histogram",
          "steps": "TGI exposes no per-step token histogram",
          "tokens": "TGI has no token counters: its rates come from the per-request length histograms "
                    "(prompts counted on arrival, outputs when a request finishes)"},
    knobs=Knobs("--max-batch-size", "--max-batch-prefill-tokens", "--max-batch-total-tokens"))
