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
  KV bytes       = L * 2 * kvh * hd * e * (sum of keys read per row + T written)
  activation bytes = L * T * e * (sum over the 7 projections of in + out widths)

A row that continues a prompt from position s with n tokens sees s+1 .. s+n keys (causal), so its
keys total n*s + n(n+1)/2; a decode row at position p sees p+1.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.device import DTYPES
from batchtop.core_engine.engine.snapshot import StepCost


@dataclass(frozen=True, slots=True)
class Chunk:
    """A run of query tokens of one sequence: positions start .. start+num_tokens-1."""

    start: int
    num_tokens: int
    keys_offset: int = 1  # query at position p sees p + keys_offset keys (0 for a padding row)


def element_size(dtype: str) -> int:
    return DTYPES[dtype].itemsize


def step_cost(model: ModelConfig, dtype: str, chunks: list[Chunk], num_logit_rows: int) -> StepCost:
    e = element_size(dtype)
    h, v, layers = model.hidden_size, model.vocab_size, model.num_hidden_layers
    layer_weights = model.layer_matmul_params()  # norms and biases are vectors, not GEMMs
    tokens = sum(c.num_tokens for c in chunks)
    keys = sum(c.num_tokens * (c.start + c.keys_offset) + c.num_tokens * (c.num_tokens - 1) // 2
               for c in chunks)

    weight_flops = 2 * layer_weights * layers * tokens + 2 * h * v * num_logit_rows
    attn_flops = layers * 4 * model.num_attention_heads * model.head_dim * keys
    weight_bytes = (model.layer_params() * layers + h * v + h) * e
    kv_row = 2 * model.kv_dim * e  # K and V of one token in one layer
    kv_bytes = layers * kv_row * (keys + tokens)
    q, kv, i = model.q_dim, model.kv_dim, model.intermediate_size
    proj_widths = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)
    act_bytes = layers * tokens * e * proj_widths
    return StepCost(flops=float(weight_flops + attn_flops),
                    bytes=float(weight_bytes + kv_bytes + act_bytes),
                    weight_flops=float(weight_flops), attn_flops=float(attn_flops),
                    weight_bytes=float(weight_bytes), kv_bytes=float(kv_bytes))


def roofline_time(flops: float, nbytes: float, peak_flops: float, peak_bytes_per_s: float) -> float:
    """The roofline model's time for a step: bound by whichever roof it hits."""
    return max(flops / peak_flops, nbytes / peak_bytes_per_s)


def marginal_sequence_cost(cost: StepCost, batch: int, peak_flops: float, peak_bytes_per_s: float) -> float:
    """Predicted relative step-time increase from one more sequence like the average one in this batch.

    Weight bytes are read once per step whatever the batch, so below the ridge the increase is small;
    past it, every extra row adds its FLOPs to a compute-bound step.
    """
    if batch < 1 or cost.bytes <= 0:
        return 0.0
    per_row_flops = cost.flops / batch
    per_row_bytes = (cost.bytes - cost.weight_bytes) / batch
    now = roofline_time(cost.flops, cost.bytes, peak_flops, peak_bytes_per_s)
    more = roofline_time(cost.flops + per_row_flops, cost.bytes + per_row_bytes, peak_flops, peak_bytes_per_s)
    return more / now - 1.0
