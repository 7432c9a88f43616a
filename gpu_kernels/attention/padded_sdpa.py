"""Every prompt chunk of a step in one scaled_dot_product_attention call: the interim prefill of the
torch reference and of the Triton backend until a varlen Triton prefill kernel exists.

The chunks are padded into a 4-D batch, (S, heads, Lq, hd) queries against (S, heads, Lc+Lq, hd) keys:
each chunk's cached keys gathered from the pool, then its own fresh keys. 4-D tensors in the model's
dtype let SDPA pick a fused kernel (3-D ones sent it to its fp32 math fallback on CUDA):
- no chunk continues a cached prefix: is_causal with enable_gqa, no mask (flash attention, CUDA and CPU);
- otherwise one boolean mask (cached keys < context start, causal over the chunk's own). The query
  heads that share a KV head are folded into that head's query rows, which needs no GQA support and
  no copy of K/V per query head (CUDA's memory-efficient kernel takes the mask; the CPU flash one too).
Rows past a chunk's end repeat its last row and are dropped at the end.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from batchtop.gpu_kernels.attention.prefill_plan import PrefillPlan


def padded_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                             v_cache: torch.Tensor, plan: PrefillPlan, scale: float) -> torch.Tensor:
    """q (T_p, nh, hd), k and v (T_p, kvh, hd): the step's prefill rows; caches (blocks, bs, kvh, hd).
    Returns (T_p, nh, hd)."""
    s, lq, lc = plan.num_chunks, plan.max_query, plan.max_context
    nh, hd = q.shape[1:]
    kvh = k.shape[1]
    qp = q.index_select(0, plan.padded_rows).view(s, lq, nh, hd)
    kp = k.index_select(0, plan.padded_rows).view(s, lq, kvh, hd)
    vp = v.index_select(0, plan.padded_rows).view(s, lq, kvh, hd)
    if plan.mask is None:
        out = F.scaled_dot_product_attention(qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2),
                                             is_causal=True, scale=scale, enable_gqa=True)
        out = out.transpose(1, 2)  # (S, Lq, nh, hd)
    else:
        kc = k_cache.view(-1, kvh, hd).index_select(0, plan.context_slots).view(s, lc, kvh, hd)
        vc = v_cache.view(-1, kvh, hd).index_select(0, plan.context_slots).view(s, lc, kvh, hd)
        keys = torch.cat((kc, kp), dim=1).transpose(1, 2)  # (S, kvh, Lc+Lq, hd)
        values = torch.cat((vc, vp), dim=1).transpose(1, 2)
        group = nh // kvh
        folded = qp.view(s, lq, kvh, group, hd).permute(0, 2, 3, 1, 4).reshape(s, kvh, group * lq, hd)
        out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=plan.folded_mask(group), scale=scale)
        out = out.view(s, kvh, group, lq, hd).permute(0, 3, 1, 2, 4)  # (S, Lq, kvh, group, hd)
    return out.reshape(s * lq, nh, hd).index_select(0, plan.token_rows)
