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
                                                           tied lm_head is still read once per step)
  KV bytes       = L * 2 * kvh * hd * e * (keys read + T written)
  activation bytes = L * T * e * (sum over the 7 projections of in + out widths)

A row that continues a prompt from position s with n tokens sees s+1 .. s+n keys (causal), so its
keys total n*s + n(n+1)/2 (the attention FLOPs); a decode row at position p sees p+1. The keys are
read from memory once per tile of QUERY_TILE queries, not once per query: a FlashAttention-style
kernel holds a tile of queries on chip while K and V stream past (and on a CPU a chunk's rows find
them in cache), so a chunk of n <= 128 tokens reads its s+n keys once, and a decode row its p+1.

Time of a step's device work, at roofs of F FLOP/s and B bytes/s: the GEMMs and attention are separate
kernels that run one after the other (paged/flash attention sits between the projections, on a CPU
as on a GPU), so each is bound by its own roof and their times add:

  matmul time    = max(weight FLOPs / F, (bytes - KV bytes) / B)      weights and activations
  attention time = max(attention FLOPs / F, KV bytes / B_kv)
  device time    = matmul time + attention time

B_kv is the bandwidth the attention kernels reach on the KV cache, B unless given: a kernel that
gathers each row's blocks from the pool need not stream them as fast as a GEMM streams its weights.

One max() over the step's totals would hide the KV read under the GEMMs' compute roof once a batch
is compute-bound, and charge nothing for a longer context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.device import DTYPES
from batchtop.core_engine.model.cost import StepCost


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
    weight_bytes = (model.layer_params() * layers + h * v + h) * e
    kv_row = 2 * model.kv_dim * e  # K and V of one token in one layer
    kv_bytes = layers * kv_row * (read + tokens)
    q, kv, i = model.q_dim, model.kv_dim, model.intermediate_size
    proj_widths = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)
    act_bytes = layers * tokens * e * proj_widths
    return StepCost(flops=float(weight_flops + attn_flops),
                    bytes=float(weight_bytes + kv_bytes + act_bytes),
                    weight_flops=float(weight_flops), attn_flops=float(attn_flops),
                    weight_bytes=float(weight_bytes), kv_bytes=float(kv_bytes))


def bound(intensity: float, ridge_flop_per_byte: float) -> str:
    return "memory-bound" if intensity < ridge_flop_per_byte else "compute-bound"


def kernel_bounds(cost: StepCost, ridge_flop_per_byte: float) -> dict[str, str]:
    """The roof each of the step's kernels is under: its GEMMs (weight FLOPs against every byte but the
    KV's) and its attention (against the KV read). The step's own intensity averages the two, so a
    large decode batch can sit left of the ridge while its GEMMs are past it."""
    gemm_bytes = cost.bytes - cost.kv_bytes
    return {"GEMMs": bound(cost.weight_flops / gemm_bytes if gemm_bytes > 0 else 0.0, ridge_flop_per_byte),
            "attention": bound(cost.attn_flops / cost.kv_bytes if cost.kv_bytes > 0 else 0.0, ridge_flop_per_byte)}


def matmul_time(cost: StepCost, peak_flops: float, peak_bytes_per_s: float) -> float:
    """The GEMMs: every weight and activation byte, against the weight FLOPs."""
    return max(cost.weight_flops / peak_flops, (cost.bytes - cost.kv_bytes) / peak_bytes_per_s)


def attention_time(cost: StepCost, peak_flops: float, peak_bytes_per_s: float,
                   kv_bytes_per_s: float | None = None) -> float:
    """Attention: the KV cache read and written (at kv_bytes_per_s, peak_bytes_per_s unless given),
    against QK^T and PV."""
    kv_rate = peak_bytes_per_s if kv_bytes_per_s is None else kv_bytes_per_s
    return max(cost.attn_flops / peak_flops, cost.kv_bytes / kv_rate)


def device_time(cost: StepCost, peak_flops: float, peak_bytes_per_s: float,
                kv_bytes_per_s: float | None = None) -> float:
    """The roofline model's time for a step: its GEMMs, then its attention, each at its own roof."""
    return (matmul_time(cost, peak_flops, peak_bytes_per_s)
            + attention_time(cost, peak_flops, peak_bytes_per_s, kv_bytes_per_s))


def one_more_row(cost: StepCost, batch: int) -> StepCost:
    """The step with one more row like the average of its `batch`: everything grows by 1/batch but
    the weights, which are read once whatever the batch."""
    grow = 1.0 + 1.0 / batch
    return StepCost(flops=cost.flops * grow, bytes=cost.weight_bytes + (cost.bytes - cost.weight_bytes) * grow,
                    weight_flops=cost.weight_flops * grow, attn_flops=cost.attn_flops * grow,
                    weight_bytes=cost.weight_bytes, kv_bytes=cost.kv_bytes * grow)


def marginal_sequence_cost(cost: StepCost, batch: int, peak_flops: float, peak_bytes_per_s: float) -> float:
    """Predicted relative step-time increase from one more sequence like the average one in this batch,
    by the same model the what-if mode times steps with (device work only).

    Weight bytes are read once per step whatever the batch, so while the GEMMs are memory-bound the
    increase is the extra row's activations and KV read; once they are compute-bound, every extra row
    adds its FLOPs to them, and its KV read to attention.
    """
    return one_more_row_increase(cost, batch, lambda c: device_time(c, peak_flops, peak_bytes_per_s))


def one_more_row_increase(cost: StepCost, batch: int, time_of: Callable[[StepCost], float]) -> float:
    """time_of(the step with one more row) / time_of(the step) - 1; 0 for an empty step."""
    if batch < 1 or cost.bytes <= 0:
        return 0.0
    return time_of(one_more_row(cost, batch)) / time_of(cost) - 1.0
