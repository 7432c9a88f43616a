"""The decoder's forward on gpu_kernels/triton_fused's kernels, where attention runs Triton (CUDA, or the
CPU under TRITON_INTERPRET=1): the same math as llama.py's modules, 9 kernels a decode layer instead of
17. The residual stream is carried beside each layer's output (vLLM's form), so each residual add runs
inside the next RMSNorm's kernel; RoPE and the K/V write are one kernel reading a cos/sin table by
position; SiLU x up is one. llama.py's modules stay the readable definition and run everywhere else."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from batchtop.core_engine.model.attention_batch import AttentionBatch
from batchtop.gpu_kernels import triton_fused, uses_triton


def fused_on_triton(x: torch.Tensor) -> bool:
    """Whether the decoder's elementwise steps run as triton_fused's kernels. Decided once per forward."""
    return uses_triton(x.device) and x.is_contiguous()


@dataclass(slots=True)
class RopeByPosition:
    """What the Triton path rotates with: the model's [cos | sin] table (max_positions, head_dim) in fp32,
    built once, and each token's position (T,)."""

    table: torch.Tensor
    positions: torch.Tensor


def rope_table(model: nn.Module, device: torch.device) -> torch.Tensor:
    """[cos | sin] (max_position_embeddings, head_dim) fp32 on `device`, built once for the model (the first
    forward there, before any graph capture) from the same inv_freq as llama.rope_cos_sin."""
    cached = model.__dict__.get("_rope_table")
    if cached is None or cached.device != device:
        cached = triton_fused.cos_sin_table(model._inv_freq, model.config.max_position_embeddings, device)
        model.__dict__["_rope_table"] = cached
    return cached


def attention(attn: nn.Module, x: torch.Tensor, rope: RopeByPosition, batch: AttentionBatch) -> torch.Tensor:
    """llama.Attention's forward, with RoPE and the K/V write as one kernel (rotating q and k in place in qkv)."""
    t = x.shape[0]
    qkv = attn.qkv_proj(x)
    qk = qkv[:, :attn.q_size + attn.kv_size].view(t, attn.num_heads + attn.num_kv_heads, attn.head_dim)
    if attn.q_norm is not None:
        qk = torch.cat((attn.q_norm(qk[:, :attn.num_heads]), attn.k_norm(qk[:, attn.num_heads:])), dim=1)
    v = qkv[:, attn.q_size + attn.kv_size:].view(t, attn.num_kv_heads, attn.head_dim)
    k_cache, v_cache = batch.kv_caches[attn.layer_idx]
    triton_fused.rope_and_store_kv(qk, v, rope.table, rope.positions, k_cache, v_cache, batch.slot_mapping,
                                   attn.num_heads)
    q, k = qk[:, :attn.num_heads], qk[:, attn.num_heads:]
    out = batch.backend.forward(q, k, v, k_cache, v_cache, batch, attn.scale)
    return attn.o_proj(out.reshape(t, attn.q_size))


def decoder_layer(layer: nn.Module, hidden: torch.Tensor, residual: torch.Tensor | None, rope: RopeByPosition,
                  batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.DecoderLayer's forward on (hidden, residual), whose sum is the layer's input (residual None:
    hidden is); returns the same pair for the next layer. Writes into both (they are the previous layer's
    temporaries, or the embeddings)."""
    norm, post, mlp = layer.input_layernorm, layer.post_attention_layernorm, layer.mlp
    if residual is None:
        residual, hidden = hidden, norm(hidden)
    else:
        residual, hidden = triton_fused.add_rmsnorm_(hidden, residual, norm.weight, norm.variance_epsilon)
    attended = attention(layer.self_attn, hidden, rope, batch)
    residual, normed = triton_fused.add_rmsnorm_(attended, residual, post.weight, post.variance_epsilon)
    return mlp.down_proj(triton_fused.silu_mul(mlp.gate_up_proj(normed))), residual


def forward_on_triton(model: nn.Module, x: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                      logits_rows: torch.Tensor) -> torch.Tensor:
    """llama.LlamaForCausalLM's forward after the embedding: the logits of logits_rows."""
    rope = RopeByPosition(rope_table(model, x.device), positions)
    batch.backend.prepare(batch)
    hidden, residual = x, None
    for layer in model.model.layers:
        hidden, residual = decoder_layer(layer, hidden, residual, rope, batch)
    hidden = hidden.index_select(0, logits_rows)  # only the rows we sample from reach the lm_head
    if residual is None:  # no layers
        return model.lm_head(model.model.norm(hidden))
    norm = model.model.norm
    _, hidden = triton_fused.add_rmsnorm_(hidden, residual.index_select(0, logits_rows), norm.weight,
                                          norm.variance_epsilon)
    return model.lm_head(hidden)
