"""llama.cpp's server (--metrics): `llamacpp:` names (tools/server/README.md), and its /slots, which
says the slot ceiling (--parallel) that /metrics does not (scrape/llamacpp_slots.py)."""

from batchtop.core_engine.attach.servers.family import Knobs, MetricNames, ServerFamily

LLAMACPP = "llamacpp"
NAMES = MetricNames(
    running="llamacpp:requests_processing", waiting="llamacpp:requests_deferred",
    prompt_tokens="llamacpp:prompt_tokens_total", generation_tokens="llamacpp:tokens_predicted_total",
    steps="llamacpp:n_decode_total")

FAMILY = ServerFamily(
    name=LLAMACPP, label="llama.cpp", documented="llama.cpp's tools/server/README.md", names=NAMES,
    prefix="llamacpp:", slots_endpoint=True,
    gaps={"ceiling": "llama.cpp says its slot count in /slots, which this server does not answer",
          "kv": "llama.cpp's /metrics has no KV usage (each slot owns n_ctx / --parallel tokens)",
          "waiting_reasons": "llama.cpp's waiting are its deferred requests: all wait for a free slot",
          "preemptions": "llama.cpp does not preempt",
          "ttft": "llama.cpp exposes no latency histograms",
          "steps": "llama.cpp counts its steps (n_decode_total) but not their tokens",
          "finished": "llama.cpp exposes no finished-request counter",
          "lengths": "llama.cpp exposes no per-request length histograms"},
    knobs=Knobs("--parallel", "--batch-size", "a larger --ctx-size or --cache-type-k q8_0"))
