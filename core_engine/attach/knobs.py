"""Each server's own name for the knob a verdict's "try" turns: the slot ceiling, the per-step token
budget and the KV pool, as that server's launch options spell them."""

from __future__ import annotations

from dataclasses import dataclass

from batchtop.core_engine.attach.flavours import (BATCHTOP, LLAMACPP, LMDEPLOY, NIM, SGLANG, TGI, TRTLLM, VLLM)


@dataclass(frozen=True, slots=True)
class Knobs:
    slots: str
    budget: str
    kv: str


KNOBS = {
    VLLM: Knobs("--max-num-seqs", "--max-num-batched-tokens",
                "--kv-cache-dtype fp8, a shorter --max-model-len or a higher --gpu-memory-utilization"),
    BATCHTOP: Knobs("--max-num-seqs", "--max-num-batched-tokens", "--num-kv-blocks"),
    SGLANG: Knobs("--max-running-requests", "--chunked-prefill-size",
                  "a higher --mem-fraction-static or --kv-cache-dtype fp8_e5m2"),
    TGI: Knobs("--max-batch-size", "--max-batch-prefill-tokens", "--max-batch-total-tokens"),
    LLAMACPP: Knobs("--parallel", "--batch-size", "a larger --ctx-size or --cache-type-k q8_0"),
    LMDEPLOY: Knobs("--max-batch-size", "--max-prefill-token-num",
                    "a higher --cache-max-entry-count or --quant-policy 8"),
    TRTLLM: Knobs("--max_batch_size", "--max_num_tokens", "a higher --kv_cache_free_gpu_memory_fraction"),
}
GENERIC = Knobs("the engine's max_num_seqs", "the engine's max_num_batched_tokens", "a larger or quantized KV cache")


def knobs(flavour: str | None) -> Knobs:
    """NIM passes its engine's options through (vLLM's or TensorRT-LLM's): the generic words."""
    return KNOBS.get(flavour or "", GENERIC) if flavour != NIM else GENERIC
