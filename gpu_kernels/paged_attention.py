"""Paged attention and the KV store, as a torch reference that runs on CPU and CUDA.

The pool for one layer is two tensors of shape (num_blocks, block_size, num_kv_heads, head_dim).
A sequence's keys live in the blocks its block table lists, in order; token position p of a sequence
sits at block_table[p // block_size], offset p % block_size. The flat "slot" of that token is
block * block_size + offset, which is what the runner's slot mapping holds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write each token's K/V (T, kvh, hd) into the pool at its slot (T,)."""
    kvh, hd = k_cache.shape[-2:]
    k_cache.view(-1, kvh, hd).index_copy_(0, slot_mapping, key)
    v_cache.view(-1, kvh, hd).index_copy_(0, slot_mapping, value)


def gather_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
              num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's first num_tokens keys and values, (num_tokens, kvh, hd) each."""
    kvh, hd = k_cache.shape[-2:]
    k = k_cache.index_select(0, block_table).view(-1, kvh, hd)[:num_tokens]
    v = v_cache.index_select(0, block_table).view(-1, kvh, hd)[:num_tokens]
    return k, v


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                      scale: float) -> torch.Tensor:
    """Causal attention of a prompt chunk at positions [start, start+Tq) over keys [0, start+Tq).

    q: (Tq, nh, hd); k, v: (start+Tq, kvh, hd). Returns (Tq, nh, hd).
    """
    tq, total = q.shape[0], k.shape[0]
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # (heads, T, hd)
    if start == 0:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, enable_gqa=True)
    else:
        q_pos = torch.arange(start, start + tq, device=q.device)
        mask = torch.arange(total, device=q.device)[None, :] <= q_pos[:, None]  # (Tq, total)
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)


def decode_mask(block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int) -> torch.Tensor:
    """(B, 1, 1, max_blocks * block_size): which gathered keys each row may see. The same for every
    layer of a step, so callers may build it once and pass it to paged_decode_attention."""
    positions = torch.arange(block_tables.shape[1] * block_size, device=block_tables.device)
    return (positions[None, :] < context_lens[:, None])[:, None, None, :]


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """One query token per sequence over its own blocks.

    q: (B, nh, hd); block_tables: (B, max_blocks) padded with any valid block; context_lens: (B,)
    keys each row may see; mask: decode_mask(block_tables, context_lens, block_size) if already
    built. Returns (B, nh, hd).
    """
    b, nh, hd = q.shape
    kvh = k_cache.shape[2]
    blocks = block_tables.reshape(-1)  # index_select: several times faster than advanced indexing here
    k = k_cache.index_select(0, blocks).view(b, -1, kvh, hd).transpose(1, 2)  # (B, kvh, L, hd)
    v = v_cache.index_select(0, blocks).view(b, -1, kvh, hd).transpose(1, 2)
    if mask is None:
        mask = decode_mask(block_tables, context_lens, k_cache.shape[1])  # (B, 1, 1, L)
    # The query heads sharing a KV head become that head's "query rows": (B, kvh, nh/kvh, hd).
    # Same math as enable_gqa, several times faster on CPU for one-token queries.
    out = F.scaled_dot_product_attention(q.view(b, kvh, nh // kvh, hd), k, v, attn_mask=mask, scale=scale)
    return out.reshape(b, nh, hd)
