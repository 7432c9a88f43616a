"""The split-KV (flash-decoding) paged decode kernels, as plain functions that Triton jits on first use.

_split_kernel: one program per (sequence, KV head, split). Each split finds its key range from the
sequence's context length on the device: with S splits, split s covers keys [s*per, (s+1)*per) where
per = max(ceil(ceil(len / S) / TILE), 1) * TILE, so a fixed S (one CUDA graph) serves any length; splits past
the length do no work and write nothing. A program walks its range a TILE of keys at a time (TILE /
block_size block-table entries per iteration), with the query heads that share the KV head padded to a
dot tile (>= 16 rows): scores and the value sum are `tl.dot`s in the KV dtype with fp32 accumulation
(tensor cores on a GPU), in an online softmax kept in the log2 domain. With one split it writes the
output; with several it writes each split's normalised output and log-sum-exp, which _merge_kernel
combines per (sequence, query head).

`jit(fn)` decorates late so TRITON_INTERPRET, read then, decides whether the kernels are interpreted.
"""

import functools
import os

try:
    import triton
    import triton.language as tl
    constexpr = tl.constexpr
except ImportError:  # a CPU-only install: the torch reference serves every device
    triton = None
    tl = None
    constexpr = int


def _split_kernel(q_ptr, k_ptr, v_ptr, out_ptr, part_ptr, lse_ptr, tables_ptr, lens_ptr, qk_scale,
                  stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_tb, stride_ob, stride_oh,
                  stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
                  GROUP: constexpr, GROUP_P: constexpr, HD: constexpr, HD_P: constexpr, BS: constexpr,
                  TILE: constexpr, SPLITS: constexpr, DIRECT: constexpr, PRECISION: constexpr):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(lens_ptr + b)
    per = tl.maximum(tl.cdiv(tl.cdiv(length, SPLITS), TILE) * TILE, TILE)
    lo = split * per
    hi = tl.minimum(lo + per, length)

    g = tl.arange(0, GROUP_P)
    d = tl.arange(0, HD_P)
    t = tl.arange(0, TILE)
    heads = kv_head * GROUP + g
    row_ok = (g < GROUP)[:, None] & (d < HD)[None, :]
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=row_ok, other=0.0)
    q = q.to(k_ptr.dtype.element_ty)
    m = tl.full([GROUP_P], float("-inf"), tl.float32)
    total = tl.full([GROUP_P], 0.0, tl.float32)
    acc = tl.full([GROUP_P, HD_P], 0.0, tl.float32)
    for start in range(lo, hi, TILE):
        pos = start + t
        valid = pos < hi
        block = tl.load(tables_ptr + b * stride_tb + pos // BS, mask=valid, other=0).to(tl.int64)
        offsets = block[:, None] * stride_kb + (pos % BS)[:, None] * stride_kt + kv_head * stride_kh + d[None, :]
        kv_mask = valid[:, None] & (d < HD)[None, :]
        k = tl.load(k_ptr + offsets, mask=kv_mask, other=0.0)  # (TILE, HD_P)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (GROUP_P, TILE), log2 units
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        rescale = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        total = total * rescale + tl.sum(p, axis=1)
        v = tl.load(v_ptr + offsets, mask=kv_mask, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * rescale[:, None], input_precision=PRECISION)
        m = m_new

    safe_total = tl.where(total > 0, total, 1.0)  # 0 only where the range is empty
    out = acc / safe_total[:, None]
    if DIRECT:
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok)
    else:
        rows_used = (g < GROUP) & (lo + 0 * g < length)  # a vector: the interpreter rejects scalar masks here
        tl.store(part_ptr + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps + d[None, :], out,
                 mask=rows_used[:, None] & (d < HD)[None, :])
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, m + tl.log2(safe_total), mask=rows_used)


def _merge_kernel(part_ptr, lse_ptr, out_ptr, lens_ptr,
                  stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
                  HD: constexpr, HD_P: constexpr, TILE: constexpr, SPLITS: constexpr, SPLITS_P: constexpr):
    """One program per (sequence, query head): the splits' outputs weighted by 2^(lse - max lse)."""
    b = tl.program_id(0)
    head = tl.program_id(1)
    length = tl.load(lens_ptr + b)
    per = tl.maximum(tl.cdiv(tl.cdiv(length, SPLITS), TILE) * TILE, TILE)  # the split kernel's cut
    used = tl.cdiv(length, per)  # the splits the split kernel wrote; the rest hold garbage
    s = tl.arange(0, SPLITS_P)
    d = tl.arange(0, HD_P)
    s_ok = s < used
    lse = tl.load(lse_ptr + b * stride_lb + head * stride_lh + s, mask=s_ok, other=float("-inf"))
    top = tl.max(lse, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)  # a zero length: every weight 0, the output 0
    weight = tl.where(s_ok, tl.exp2(lse - top), 0.0)
    parts = tl.load(part_ptr + b * stride_pb + head * stride_ph + s[:, None] * stride_ps + d[None, :],
                    mask=s_ok[:, None] & (d < HD)[None, :], other=0.0)
    total = tl.sum(weight, axis=0)
    out = tl.sum(weight[:, None] * parts, axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + b * stride_ob + head * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d < HD)


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _jitted(fn, interpret: bool):  # noqa: ARG001 (the cache key: interpreted and compiled differ)
    if triton is None:
        raise RuntimeError("triton is not installed")
    return triton.jit(fn)


def jit(fn):
    """fn jitted, for the interpreter when TRITON_INTERPRET=1 now, else for the compiler."""
    return _jitted(fn, interpreted())
