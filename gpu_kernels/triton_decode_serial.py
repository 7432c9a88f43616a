"""The first Triton decode kernel, kept as the baseline bench/gpu_suite.py times the split-KV kernel
against: one program per (sequence, KV head) walks the whole context one block per iteration, with
fp32 broadcast-and-sum instead of `tl.dot` (8 programs on 132 SMs at batch 1 of an 8B model).
Same contract as triton_decode.paged_decode_attention_triton; nothing in the engine calls it.
"""

import torch

from batchtop.gpu_kernels.triton_decode_kernels import constexpr, jit, tl


def _serial_kernel(q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, lens_ptr, scale,
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


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def paged_decode_attention_serial(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  block_tables: torch.Tensor, context_lens: torch.Tensor,
                                  scale: float) -> torch.Tensor:
    b, nh, hd = q.shape
    _, bs, kvh, _ = k_cache.shape
    assert q.stride(2) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous() and block_tables.stride(1) == 1
    out = torch.empty((b, nh, hd), dtype=q.dtype, device=q.device)
    group = nh // kvh
    jit(_serial_kernel)[(b, kvh)](q, k_cache, v_cache, out, block_tables, context_lens, scale,
                                  q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                                  block_tables.stride(0), out.stride(0), out.stride(1),
                                  GROUP=group, GROUP_P=_pow2(group), HD=hd, HD_P=_pow2(hd), BS=bs, BS_P=_pow2(bs))
    return out
