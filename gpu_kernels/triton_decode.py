"""Paged decode attention as a Triton kernel: reads each sequence's blocks in place from the pool.

Same math as paged_attention.paged_decode_attention (the readable definition): one query token per
sequence, attending to its first context_lens[b] keys, which live in the blocks its block table
lists. One program per (sequence, KV head) walks the table block by block with an online softmax
(running max and sum in fp32), so no dense copy of the sequence's keys is ever made. The query heads
that share a KV head are handled together, so each K/V block is read once for the whole group.
On CUDA it is what the model calls for decode rows; tests run it on the CPU under Triton's
interpreter (TRITON_INTERPRET=1) against the torch reference.
"""

import functools
import os

import torch

try:
    import triton
    import triton.language as tl
    constexpr = tl.constexpr
except ImportError:  # a CPU-only install: the torch reference serves every device
    triton = None
    constexpr = int


def available() -> bool:
    return triton is not None


def _decode_kernel(q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, lens_ptr, scale,
                   stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_tb, stride_ob, stride_oh,
                   GROUP: constexpr, GROUP_P: constexpr, HD: constexpr, HD_P: constexpr,
                   BS: constexpr, BS_P: constexpr):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    g = tl.arange(0, GROUP_P)
    d = tl.arange(0, HD_P)
    t = tl.arange(0, BS_P)
    g_ok, d_ok = g < GROUP, d < HD
    heads = kv_head * GROUP + g
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    length = tl.load(lens_ptr + b)
    m = tl.full([GROUP_P], float("-inf"), tl.float32)
    total = tl.full([GROUP_P], 0.0, tl.float32)
    acc = tl.full([GROUP_P, HD_P], 0.0, tl.float32)
    for i in range(0, (length + BS - 1) // BS):
        block = tl.load(tables_ptr + b * stride_tb + i).to(tl.int64)
        valid = (t < BS) & (i * BS + t < length)
        offsets = block * stride_kb + t[:, None] * stride_kt + kv_head * stride_kh + d[None, :]
        kv_mask = valid[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + offsets, mask=kv_mask, other=0.0).to(tl.float32)  # (BS_P, HD_P)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # (GROUP_P, BS_P)
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        rescale = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])
        total = total * rescale + tl.sum(p, axis=1)
        v = tl.load(v_ptr + offsets, mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * rescale[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    out = acc / total[:, None]
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])


@functools.cache
def _compiled(interpret: bool):  # noqa: ARG001 (the cache key: interpreted and compiled differ)
    """The jitted kernel; built on first use, so TRITON_INTERPRET read then decides how it runs."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    return triton.jit(_decode_kernel)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def paged_decode_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  block_tables: torch.Tensor, context_lens: torch.Tensor,
                                  scale: float) -> torch.Tensor:
    """q: (B, nh, hd); caches (num_blocks, block_size, kvh, hd); block_tables (B, >= needed blocks);
    context_lens (B,) >= 1. Returns (B, nh, hd) in q's dtype."""
    b, nh, hd = q.shape
    _, bs, kvh, _ = k_cache.shape
    assert q.stride(2) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous() and block_tables.stride(1) == 1
    out = torch.empty((b, nh, hd), dtype=q.dtype, device=q.device)
    group = nh // kvh
    kernel = _compiled(os.environ.get("TRITON_INTERPRET") == "1")
    kernel[(b, kvh)](q, k_cache, v_cache, out, block_tables, context_lens, scale,
                     q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                     block_tables.stride(0), out.stride(0), out.stride(1),
                     GROUP=group, GROUP_P=_pow2(group), HD=hd, HD_P=_pow2(hd), BS=bs, BS_P=_pow2(bs))
    return out
