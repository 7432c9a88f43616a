"""The Triton varlen paged prefill kernel, run on the CPU under Triton's interpreter, against the torch
reference (gather_kv + prefill_attention, chunk by chunk).

The interpreter computes bf16 `tl.dot` wrongly, so the dot paths are checked here in fp32; bf16 is
compiled for sm_90 in test_triton_offline_compile.py and timed on a GPU by bench/prefill_kernel_timing.py.
Every pool slot no chunk may read holds NaN, so a key read past a causal row or a length shows as NaN.
Small block_m / block_n put query-tile and key-tile edges inside the small chunks: with block_m 16 a tile
holds 16 rows at group 1, 5 at group 3 (15 of 16 dot rows used) and 4 at group 4.
"""

from __future__ import annotations

import pytest
import torch

from batchtop.gpu_kernels import gather_kv, prefill_attention, triton_prefill
from batchtop.gpu_kernels.triton_prefill import paged_prefill_attention_triton
from tests.kernels.test_triton_decode import poisoned_pool
from tests.support.triton_interpreter import interpret  # noqa: F401  (a fixture)

pytestmark = pytest.mark.skipif(not triton_prefill.available(), reason="triton is not installed")


def chunked_step(rows: list[int], contexts: list[int], heads: int, kv_heads: int, head_dim: int, block_size: int,
                 seed: int, q_row_stride_heads: int = 0):
    """One step's prefill: chunk s has rows[s] query rows after contexts[s] cached tokens, its sequence's
    keys (cached + its own) in a NaN-poisoned shared pool. q may be a view with a wider row stride."""
    gen = torch.Generator().manual_seed(seed)
    k_cache, v_cache, tables = poisoned_pool([c + n for c, n in zip(contexts, rows)], kv_heads, head_dim,
                                             block_size, gen)
    fused = torch.randn(sum(rows), heads + q_row_stride_heads, head_dim, generator=gen)
    q = fused[:, :heads]
    starts = torch.tensor([0, *torch.tensor(rows).cumsum(0).tolist()], dtype=torch.int32)
    return q, k_cache, v_cache, tables, starts, torch.tensor(contexts, dtype=torch.int32)


def reference(q, k_cache, v_cache, tables, starts, contexts, scale):
    outs = []
    block_size = k_cache.shape[1]
    for s in range(len(contexts)):
        lo, hi, ctx = int(starts[s]), int(starts[s + 1]), int(contexts[s])
        total = ctx + hi - lo
        k, v = gather_kv(k_cache, v_cache, tables[s, :-(-total // block_size)].long(), total)
        outs.append(prefill_attention(q[lo:hi], k, v, ctx, scale))
    return torch.cat(outs)


def check(q, k_cache, v_cache, tables, starts, contexts, **tiles):
    scale = q.shape[-1] ** -0.5
    got = paged_prefill_attention_triton(q, k_cache, v_cache, tables, starts, contexts, scale, **tiles)
    want = reference(q, k_cache, v_cache, tables, starts, contexts, scale)
    assert got.shape == want.shape == q.shape and got.dtype == q.dtype
    assert not got.isnan().any(), "the kernel read a key it must not see"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# fresh prompts, a one-row chunk, continuations that start mid-block and right after a block edge
ROWS = [9, 1, 23, 5, 17]
CONTEXTS = [0, 17, 13, 40, 16]


@pytest.mark.parametrize("group,kv_heads,head_dim,block_size", [
    (1, 2, 64, 16), (3, 2, 80, 4), (4, 1, 128, 1), (4, 2, 64, 3)])
def test_several_chunks_and_continuations_in_one_call_match_the_reference(interpret, group, kv_heads, head_dim,
                                                                         block_size):
    step = chunked_step(ROWS, CONTEXTS, group * kv_heads, kv_heads, head_dim, block_size,
                        seed=group * 100 + head_dim + block_size)
    check(*step, block_m=16, block_n=16)


def test_the_default_tiles_cover_long_chunks_with_several_query_and_key_tiles(interpret):
    # fp32 defaults: 32 dot rows = 16 query rows at group 2, 16 keys a tile; 150 rows = 10 query tiles
    step = chunked_step([150, 3, 40], [0, 70, 33], 4, 2, 64, 16, seed=7)
    assert triton_prefill.tile_shape(2, 64, torch.float32)[:2] == (32, 16)
    check(*step)


@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64])
def test_a_strided_query_view_and_either_table_dtype_match_the_reference(interpret, table_dtype):
    q, k_cache, v_cache, tables, starts, contexts = chunked_step([6, 11], [5, 0], 6, 2, 80, 4, seed=3,
                                                                 q_row_stride_heads=4)
    assert not q.is_contiguous() and q.stride(0) == 10 * 80  # as a view of the fused qkv projection
    check(q, k_cache, v_cache, tables.to(table_dtype), starts, contexts, block_m=32, block_n=16)


def test_a_single_one_row_chunk_deep_in_its_context_is_a_decode_step(interpret):
    step = chunked_step([1], [37], 4, 2, 64, 16, seed=5)
    check(*step, block_m=16, block_n=16)


def test_no_rows_launch_nothing_and_mismatched_heads_are_refused():
    k_cache = torch.zeros(4, 16, 2, 64)
    table, context = torch.zeros(1, 2, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    empty = paged_prefill_attention_triton(torch.zeros(0, 4, 64), k_cache, k_cache, table,
                                           torch.zeros(2, dtype=torch.int32), context, 0.1)
    assert empty.shape == (0, 4, 64)
    with pytest.raises(ValueError, match="5 heads of 64"):
        paged_prefill_attention_triton(torch.zeros(3, 5, 64), k_cache, k_cache, table,
                                       torch.tensor([0, 3], dtype=torch.int32), context, 0.1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled bf16 kernel needs CUDA")
def test_the_compiled_bf16_kernel_at_gpu_8b_dims_matches_the_fp32_reference_on_cuda():
    q, k_cache, v_cache, tables, starts, contexts = (
        t.cuda() for t in chunked_step([300, 1, 64], [0, 77, 200], 32, 8, 128, 16, seed=11))
    fused = torch.zeros(q.shape[0], 48, 128, dtype=torch.bfloat16, device="cuda")  # q as a view of the qkv rows
    fused[:, :32] = q
    q, k_cache, v_cache = fused[:, :32], k_cache.bfloat16(), v_cache.bfloat16()
    got = paged_prefill_attention_triton(q, k_cache, v_cache, tables.int(), starts, contexts, 128 ** -0.5)
    want = reference(q.float(), k_cache.float(), v_cache.float(), tables, starts, contexts, 128 ** -0.5)
    assert got.dtype == torch.bfloat16 and not got.isnan().any()
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
