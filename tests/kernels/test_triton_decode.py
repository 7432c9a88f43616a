"""The Triton decode kernel, run on the CPU under Triton's interpreter, against the torch reference."""

from __future__ import annotations

import pytest
import torch

from batchtop.core_engine.engine.engine import Engine
from batchtop.gpu_kernels import paged_decode_attention, triton_decode, uses_triton
from tests.conftest import make_requests, run_all, tiny_config
from tests.kernels.test_paged_attention import HD, NH, scattered_pool
from tests.support.triton_interpreter import interpret  # noqa: F401  (a fixture)


@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
def test_the_kernel_reads_scattered_blocks_in_place_like_the_reference(interpret, block_size):
    gen = torch.Generator().manual_seed(block_size)
    k_cache, v_cache, table, _, _ = scattered_pool(37, block_size, gen)
    # rows of different lengths over one shuffled table, padded past what any row needs
    tables = torch.cat([table, table[:2]])[None, :].repeat(4, 1)
    lengths = torch.tensor([37, 1, block_size + 1, 20])
    q = torch.randn(4, NH, HD, generator=gen)
    want = paged_decode_attention(q, k_cache, v_cache, tables, lengths, HD ** -0.5)
    got = triton_decode.paged_decode_attention_triton(q, k_cache, v_cache, tables, lengths, HD ** -0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_bf16_odd_head_dim_and_a_strided_query_match_the_reference(interpret):
    gen = torch.Generator().manual_seed(1)
    hd, nh, kvh, bs = 80, 6, 2, 16
    k_cache = torch.randn(9, bs, kvh, hd, generator=gen).bfloat16()
    v_cache = torch.randn(9, bs, kvh, hd, generator=gen).bfloat16()
    qkv = torch.randn(3, nh + 2 * kvh, hd, generator=gen).bfloat16()
    q = qkv[:, :nh]  # a view with the row stride of the fused projection, as the model passes it
    tables = torch.randperm(9, generator=gen)[:6].view(3, 2)
    lengths = torch.tensor([32, 5, 17])
    want = paged_decode_attention(q.float(), k_cache.float(), v_cache.float(), tables, lengths, hd ** -0.5)
    got = triton_decode.paged_decode_attention_triton(q, k_cache, v_cache, tables, lengths, hd ** -0.5)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


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
