"""The Triton split-KV decode kernels, run on the CPU under Triton's interpreter, against the torch reference.

The interpreter computes bf16 `tl.dot` wrongly, so every dot path is checked here in fp32; bf16 runs on
a GPU (tests/kernels/test_gpu.py). TILE is 64 keys: with 3 splits a length of 64 fills exactly one
split, 65 spills into a second, 192 fills all three, 193 re-cuts them at 128 keys, 400 at 192 (three
tiles a split).
"""

from __future__ import annotations

import pytest
import torch

from batchtop.core_engine.engine.engine import Engine
from batchtop.gpu_kernels import paged_decode_attention, triton_decode, uses_triton
from batchtop.gpu_kernels.triton_decode_serial import paged_decode_attention_serial
from tests.conftest import make_requests, run_all, tiny_config
from tests.kernels.test_paged_attention import HD, NH, scattered_pool
from tests.support.triton_interpreter import interpret  # noqa: F401  (a fixture)

ACROSS_SPLITS = [1, 64, 65, 192, 193, 400]


def poisoned_pool(lengths: list[int], kv_heads: int, head_dim: int, block_size: int, gen: torch.Generator):
    """Each row's keys in shuffled blocks of one pool; every slot no row may read (the tail of a row's
    last block, the spare blocks, the padding that ends every table row) holds NaN, so a kernel that
    reads one key too many returns NaN."""
    need = [-(-n // block_size) for n in lengths]
    num_blocks = sum(need) + 3
    k_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"))
    v_cache = k_cache.clone()
    order = torch.randperm(num_blocks, generator=gen)
    tables = torch.full((len(lengths), max(need) + 2), int(order[-1]))
    used = 0
    for row, (n, blocks) in enumerate(zip(lengths, need)):
        tables[row, :blocks] = order[used:used + blocks]
        used += blocks
        pos = torch.arange(n)
        slots = tables[row, pos // block_size], pos % block_size
        k_cache[slots] = torch.randn(n, kv_heads, head_dim, generator=gen)
        v_cache[slots] = torch.randn(n, kv_heads, head_dim, generator=gen)
    return k_cache, v_cache, tables


def check_against_reference(q, k_cache, v_cache, tables, lengths, num_splits=None, kernel=None):
    scale = q.shape[-1] ** -0.5
    want = paged_decode_attention(q, k_cache.nan_to_num(), v_cache.nan_to_num(), tables, lengths, scale)
    kernel = kernel or triton_decode.paged_decode_attention_triton
    got = kernel(q, k_cache, v_cache, tables, lengths, scale, **({"num_splits": num_splits} if num_splits else {}))
    assert got.shape == want.shape and got.dtype == q.dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group,kv_heads,head_dim,block_size", [
    (1, 2, 64, 16), (3, 2, 80, 4), (4, 1, 128, 1), (8, 1, 80, 16)])
def test_three_splits_match_the_reference_at_every_split_boundary(interpret, group, kv_heads, head_dim, block_size):
    gen = torch.Generator().manual_seed(group * 1000 + head_dim + block_size)
    k_cache, v_cache, tables = poisoned_pool(ACROSS_SPLITS, kv_heads, head_dim, block_size, gen)
    q = torch.randn(len(ACROSS_SPLITS), group * kv_heads, head_dim, generator=gen)
    check_against_reference(q, k_cache, v_cache, tables, torch.tensor(ACROSS_SPLITS), num_splits=3)


@pytest.mark.parametrize("num_splits", [1, 2, 7])
def test_any_split_count_gives_the_reference_even_with_splits_past_every_length(interpret, num_splits):
    gen = torch.Generator().manual_seed(num_splits)
    lengths = [1, 130, 300]
    k_cache, v_cache, tables = poisoned_pool(lengths, 2, 64, 16, gen)
    q = torch.randn(len(lengths), 4, 64, generator=gen)
    check_against_reference(q, k_cache, v_cache, tables, torch.tensor(lengths), num_splits=num_splits)


def test_the_split_count_fills_the_sms_at_batch_one_and_never_depends_on_the_lengths():
    assert triton_decode.choose_num_splits(1, 8, 512, 16, sms=132) == 17  # 136 programs >= 132 SMs
    assert triton_decode.choose_num_splits(64, 8, 512, 16, sms=132) == 1  # 512 programs already
    assert triton_decode.choose_num_splits(8, 8, 512, 16, sms=132) == 3
    assert triton_decode.choose_num_splits(1, 8, 2, 16, sms=132) == 1  # a 32-key table fills one tile
    assert triton_decode.choose_num_splits(1, 1, 4096, 16, sms=132) == triton_decode.MAX_SPLITS


@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
def test_the_kernel_reads_scattered_blocks_in_place_like_the_reference(interpret, block_size):
    gen = torch.Generator().manual_seed(block_size)
    k_cache, v_cache, table, _, _ = scattered_pool(37, block_size, gen)
    # rows of different lengths over one shuffled table, padded past what any row needs
    tables = torch.cat([table, table[:2]])[None, :].repeat(4, 1)
    lengths = torch.tensor([37, 1, block_size + 1, 20])
    q = torch.randn(4, NH, HD, generator=gen)
    check_against_reference(q, k_cache, v_cache, tables, lengths)


def test_a_strided_query_an_odd_head_dim_and_int32_tables_match_the_reference(interpret):
    gen = torch.Generator().manual_seed(1)
    hd, nh, kvh, bs = 80, 6, 2, 16
    k_cache, v_cache, tables = poisoned_pool([32, 5, 100], kvh, hd, bs, gen)
    qkv = torch.randn(3, nh + 2 * kvh, hd, generator=gen)
    q = qkv[:, :nh]  # a view with the row stride of the fused projection, as the model passes it
    assert not q.is_contiguous()
    check_against_reference(q, k_cache, v_cache, tables.int(), torch.tensor([32, 5, 100], dtype=torch.int32),
                            num_splits=2)


def test_the_serial_baseline_the_gpu_suite_times_also_matches_the_reference(interpret):
    gen = torch.Generator().manual_seed(5)
    k_cache, v_cache, tables = poisoned_pool([1, 40], 2, 16, 4, gen)
    q = torch.randn(2, 4, 16, generator=gen)
    check_against_reference(q, k_cache, v_cache, tables, torch.tensor([1, 40]), kernel=paged_decode_attention_serial)


def test_the_engine_on_the_kernel_gives_the_reference_tokens_alone_and_batched(interpret):
    assert uses_triton(torch.device("cpu"))
    requests = make_requests(5, seed=11, prompt=(3, 20), output=(6, 12))
    batched, _, _ = run_all(Engine(tiny_config(max_num_seqs=5)), requests)
    alone = {}
    for r in requests[:2]:
        alone.update(run_all(Engine(tiny_config(max_num_seqs=1)), [r])[0])
    with pytest.MonkeyPatch.context() as m:
        m.delenv("TRITON_INTERPRET")
        assert not uses_triton(torch.device("cpu"))
        reference, _, _ = run_all(Engine(tiny_config(max_num_seqs=5)), requests)
    assert batched == reference
    assert all(alone[r.id] == batched[r.id] for r in requests[:2])
