"""FLOPs and bytes of one forward step, counted analytically from the model dims and the batch.

Per step with T tokens fed, S rows through the lm_head, L layers, hidden H, q heads nh, kv heads kvh,
head dim hd (its own number on Qwen3: not always H / nh), element size e bytes (in the spirit of
nanoGPT's estimate_mfu):

  weight FLOPs   = 2 * P_matmul * T + 2 * H * V * S        every token meets every layer weight once;
                                                           only sampled rows (and static batching's
                                                           padding rows) reach the lm_head
  attention FLOPs = L * sum over query tokens of 4 * nh * hd * keys_seen     (QK^T and PV)
  weight bytes   = (P_layers + H * V + H) * e              read once per step, whatever the batch:
                                                           this is why decode batching is nearly free
                                                           (P_layers counts biases and norms too; a
                                                           tied lm_head is still read once per step).
                                                           A quantized GGUF run reads its linears' and
                                                           lm_head's blocks instead: their weights at
                                                           the stored bits per weight (weight_bytes.py)
  KV bytes       = L * 2 * kvh * hd * e * (keys read + T written)
  activation bytes = L * T * e * (sum over the 7 projections of in + out widths)

A row that continues a prompt from position s with n tokens sees s+1 .. s+n keys (causal), so its
keys total n*s + n(n+1)/2 (the attention FLOPs); a decode row at position p sees p+1. The keys are
read from memory once per tile of QUERY_TILE queries, not once per query: a FlashAttention-style
kernel holds a tile of queries on chip while K and V stream past (and on a CPU a chunk's rows find
them in cache), so a chunk of n <= 128 tokens reads its s+n keys once, and a decode row its p+1.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.device import DTYPES
from batchtop.core_engine.model.weight_bytes import step_weight_bytes


@dataclass(frozen=True, slots=True)
class StepCost:
    """Analytic work of one step: what step_cost counts."""

    flops: float = 0.0
    bytes: float = 0.0
    weight_flops: float = 0.0
    attn_flops: float = 0.0
    weight_bytes: float = 0.0
    kv_bytes: float = 0.0

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else 0.0


QUERY_TILE = 128  # queries that share one read of the keys (FlashAttention-2's block of queries)


@dataclass(frozen=True, slots=True)
class Chunk:
    """A run of query tokens of one sequence: positions start .. start+num_tokens-1."""

    start: int
    num_tokens: int
    keys_offset: int = 1  # query at position p sees p + keys_offset keys (0 for a padding row)


def element_size(dtype: str) -> int:
    return DTYPES[dtype].itemsize


def keys_read(chunk: Chunk) -> int:
    """Keys the chunk reads from the cache: each tile of QUERY_TILE queries reads the keys its last query
    sees. With t tiles and the first query seeing b+1 keys: t*b + QUERY_TILE*t(t-1)/2 + n."""
    tiles = -(-chunk.num_tokens // QUERY_TILE)
    before = chunk.start + chunk.keys_offset - 1  # keys the chunk's first query sees, less itself
    return tiles * before + QUERY_TILE * tiles * (tiles - 1) // 2 + chunk.num_tokens


def step_cost(model: ModelConfig, dtype: str, chunks: list[Chunk], num_logit_rows: int) -> StepCost:
    e = element_size(dtype)
    h, v, layers = model.hidden_size, model.vocab_size, model.num_hidden_layers
    layer_weights = model.layer_matmul_params()  # norms and biases are vectors, not GEMMs
    tokens = keys = read = 0
    for c in chunks:  # one pass: a simulated step at 512 rows spends its time here
        seen = c.start + c.keys_offset  # keys the chunk's first query sees
        if c.num_tokens == 1:  # a decode row: it sees and reads its keys once
            tokens, keys, read = tokens + 1, keys + seen, read + seen
        else:
            n = c.num_tokens
            tokens, keys, read = tokens + n, keys + n * seen + n * (n - 1) // 2, read + keys_read(c)

    weight_flops = 2 * layer_weights * layers * tokens + 2 * h * v * num_logit_rows
    attn_flops = layers * 4 * model.num_attention_heads * model.head_dim * keys
    weight_bytes = step_weight_bytes(model, e)
    kv_row = 2 * model.kv_dim * e  # K and V of one token in one layer
    kv_bytes = layers * kv_row * (read + tokens)
    q, kv, i = model.q_dim, model.kv_dim, model.intermediate_size
    proj_widths = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)
    act_bytes = layers * tokens * e * proj_widths
    return StepCost(flops=float(weight_flops + attn_flops),
                    bytes=float(weight_bytes + kv_bytes + act_bytes),
                    weight_flops=float(weight_flops), attn_flops=float(attn_flops),
                    weight_bytes=float(weight_bytes), kv_bytes=float(kv_bytes))
