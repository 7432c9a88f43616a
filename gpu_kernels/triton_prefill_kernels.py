"""The varlen paged prefill attention kernel (flash-attention style), as a plain function that Triton
jits on first use (triton_decode_kernels.jit, so TRITON_INTERPRET decides at call time).

One program per (query tile, KV head). The query tiles of all chunks form one flat axis: chunk s owns
tiles [start_s // BLOCK_Q + s, start_{s+1} // BLOCK_Q + s + 1), always at least its ceil(rows / BLOCK_Q),
so the grid is T // BLOCK_Q + S programs, sized from host shapes alone (no device-to-host sync, one
CUDA graph per (T, S)); a program finds its chunk by binary search over query_start_loc, and programs
past their chunk's rows exit. The tiles run in reverse, so the longest rows (the bottom of a causal
chunk) start first.

A tile is BLOCK_Q query rows x the GROUP query heads of one KV head: BLOCK_M = BLOCK_Q * GROUP (padded to
a power of two) rows of the score dot, so each K/V tile is read once for the whole group. Keys are
walked BLOCK_N at a time through the chunk's block table (BLOCK_N / block_size table entries per tile):
first the tiles every row sees whole (no mask), then the one or two tiles on the causal diagonal
(masked); tiles above the diagonal are never loaded. Online softmax in fp32 in the log2 domain; `tl.dot`
in the KV dtype with fp32 accumulation (tensor cores on a GPU).
"""

from batchtop.gpu_kernels.triton_decode_kernels import constexpr, tl


def _prefill_kernel(q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, starts_ptr, ctx_ptr, qk_scale, num_chunks, num_tiles,
                    stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_tb, stride_ot, stride_oh,
                    GROUP: constexpr, BLOCK_M: constexpr, BLOCK_Q: constexpr, BLOCK_N: constexpr,
                    HD: constexpr, HD_P: constexpr, BS: constexpr, PRECISION: constexpr):
    tile = num_tiles - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)

    # the chunk: the last s whose first tile (start_s // BLOCK_Q + s) is <= tile
    lo = tl.program_id(0) * 0
    hi = lo + num_chunks
    while lo < hi:
        mid = (lo + hi) // 2
        right = tl.load(starts_ptr + mid) // BLOCK_Q + mid <= tile
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(right, hi, mid)
    chunk = lo - 1
    q_start = tl.load(starts_ptr + chunk)
    rows = tl.load(starts_ptr + chunk + 1) - q_start
    q_tile = tile - (q_start // BLOCK_Q + chunk)
    if q_tile * BLOCK_Q >= rows:
        return
    context = tl.load(ctx_ptr + chunk)

    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, HD_P)
    n = tl.arange(0, BLOCK_N)
    q_row = q_tile * BLOCK_Q + r // GROUP  # the row within the chunk
    head = kv_head * GROUP + r % GROUP
    row_ok = (r < BLOCK_Q * GROUP) & (q_row < rows)
    d_ok = d < HD
    q_offsets = (q_start + q_row).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_offsets, mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(k_ptr.dtype.element_ty)
    q_pos = context + q_row  # absolute positions; padding rows get positions too, their output is dropped
    first_pos = context + q_tile * BLOCK_Q
    end = context + tl.minimum(q_tile * BLOCK_Q + BLOCK_Q, rows)  # keys [0, end) cover the tile
    full_end = (first_pos + 1) // BLOCK_N * BLOCK_N  # keys [0, full_end) are visible to every row
    table = tables_ptr + chunk.to(tl.int64) * stride_tb
    head_offset = kv_head * stride_kh

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    total = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, HD_P], 0.0, tl.float32)
    for start in range(0, full_end, BLOCK_N):
        pos = start + n
        block = tl.load(table + pos // BS).to(tl.int64)
        offsets = block[:, None] * stride_kb + (pos % BS)[:, None] * stride_kt + head_offset + d[None, :]
        if HD == HD_P:
            k = tl.load(k_ptr + offsets)
        else:
            k = tl.load(k_ptr + offsets, mask=d_ok[None, :], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        rescale = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        total = total * rescale + tl.sum(p, axis=1)
        if HD == HD_P:
            v = tl.load(v_ptr + offsets)
        else:
            v = tl.load(v_ptr + offsets, mask=d_ok[None, :], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * rescale[:, None], input_precision=PRECISION)
        m = m_new
    for start in range(full_end, end, BLOCK_N):  # the diagonal: at most two tiles
        pos = start + n
        valid = pos < end
        block = tl.load(table + pos // BS, mask=valid, other=0).to(tl.int64)
        offsets = block[:, None] * stride_kb + (pos % BS)[:, None] * stride_kt + head_offset + d[None, :]
        kv_mask = valid[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + offsets, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        scores = tl.where((pos[None, :] <= q_pos[:, None]) & valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))  # finite: every row sees key 0 by its first tile
        rescale = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        total = total * rescale + tl.sum(p, axis=1)
        v = tl.load(v_ptr + offsets, mask=kv_mask, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * rescale[:, None], input_precision=PRECISION)
        m = m_new

    out = acc / total[:, None]
    out_offsets = (q_start + q_row).to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
