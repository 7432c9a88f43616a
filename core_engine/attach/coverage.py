"""What each server's metrics can fill on the attach panels, and what they cannot, in the words the
panels show where a number is missing (a "not exposed" that says why, and what to do instead)."""

from __future__ import annotations

from batchtop.core_engine.attach.flavours import (BATCHTOP, LABELS, LLAMACPP, LMDEPLOY, NIM, SGLANG, TGI, TRTLLM,
                                                  VLLM)

# what -> the panel's words when a flavour lacks it; a flavour not listed for a `what` has it
GAPS: dict[str, dict[str, str]] = {
    "ceiling": {
        VLLM: "vLLM does not export max_num_seqs",
        SGLANG: "SGLang does not export max_running_requests",
        TGI: "TGI does not export max_batch_size",
        LMDEPLOY: "LMDeploy does not export max_batch_size",
        LLAMACPP: "llama.cpp says its slot count in /slots, which this server does not answer",
    },
    "kv": {
        TGI: "TGI exposes no KV usage (its budget, max_batch_total_tokens, is not exported)",
        LLAMACPP: "llama.cpp's /metrics has no KV usage (each slot owns n_ctx / --parallel tokens)",
    },
    "waiting_reasons": {
        SGLANG: "SGLang gives no waiting reasons", TGI: "TGI gives no waiting reasons",
        LLAMACPP: "llama.cpp's waiting are its deferred requests: all wait for a free slot",
        LMDEPLOY: "LMDeploy gives no waiting reasons", NIM: "NIM gives no waiting reasons",
        BATCHTOP: "batchtop serve gives no waiting reasons on /metrics",
    },
    "preemptions": {
        SGLANG: "SGLang exposes no preemption counter", TGI: "TGI exposes no preemption counter",
        LLAMACPP: "llama.cpp does not preempt", LMDEPLOY: "LMDeploy exposes no preemption counter",
        NIM: "NIM exposes no preemption counter",
        TRTLLM: "TensorRT-LLM shows preempted requests as paused (numPausedRequests), not as a counter",
    },
    "ttft": {TGI: "TGI exposes no TTFT histogram", LLAMACPP: "llama.cpp exposes no latency histograms",
             TRTLLM: "trtllm-serve's /metrics has no latency histograms"},
    "steps": {SGLANG: "SGLang exposes no per-step token histogram", TGI: "TGI exposes no per-step token histogram",
              NIM: "NIM exposes no per-step token histogram",
              LLAMACPP: "llama.cpp counts its steps (n_decode_total) but not their tokens"},
    "finished": {SGLANG: "SGLang exposes no finished-request counter",
                 LLAMACPP: "llama.cpp exposes no finished-request counter"},
    "lengths": {SGLANG: "SGLang exposes no per-request length histograms",
                LLAMACPP: "llama.cpp exposes no per-request length histograms",
                TRTLLM: "trtllm-serve's /metrics has no per-request length histograms"},
    "tokens": {TGI: "TGI has no token counters: its rates come from the per-request length histograms "
                    "(prompts counted on arrival, outputs when a request finishes)",
               TRTLLM: "TensorRT-LLM's rates are summed from its iteration stats since attach began"},
}


def gap(flavour: str | None, what: str, default: str = "not exposed") -> str:
    """Why `what` is missing for this flavour (or `default` when nothing specific is known)."""
    if flavour is None:
        return default
    return GAPS.get(what, {}).get(flavour, default)


def coverage(flavour: str) -> dict[str, str | None]:
    """Every `what`, with None where the flavour fills it: the JSON's `coverage` and the docs' table."""
    return {what: by_flavour.get(flavour) for what, by_flavour in GAPS.items()}


def label(flavour: str | None) -> str:
    return LABELS.get(flavour or "", flavour or "no server yet")
