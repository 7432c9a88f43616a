"""Paged attention over scattered blocks equals dense causal attention on the same Q/K/V."""

from __future__ import annotations

import math

import pytest
import torch

from batchtop.gpu_kernels import gather_kv, paged_decode_attention, prefill_attention, store_kv

NH, KVH, HD = 4, 2, 16


def dense_causal(q, k, v, start):
    """Reference: explicit softmax(QK^T / sqrt(d)) V with GQA by repetition; q at positions start.."""
    rep = NH // KVH
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(HD)
    q_pos = torch.arange(start, start + q.shape[0])[:, None]
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def scattered_pool(total_tokens: int, block_size: int, gen: torch.Generator):
    """A pool with more blocks than needed and a shuffled block table, filled through store_kv."""
    num_blocks = -(-total_tokens // block_size) + 5
    k_cache = torch.zeros(num_blocks, block_size, KVH, HD)
    v_cache = torch.zeros_like(k_cache)
    table = torch.randperm(num_blocks, generator=gen)[: -(-total_tokens // block_size)]
    k = torch.randn(total_tokens, KVH, HD, generator=gen)
    v = torch.randn(total_tokens, KVH, HD, generator=gen)
    pos = torch.arange(total_tokens)
    slots = table[pos // block_size] * block_size + pos % block_size
    store_kv(k, v, k_cache, v_cache, slots)
    return k_cache, v_cache, table, k, v


@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
@pytest.mark.parametrize("start,chunk", [(0, 11), (5, 7), (16, 1)])
def test_prefill_chunk_over_paged_blocks_matches_dense(block_size, start, chunk):
    gen = torch.Generator().manual_seed(block_size * 100 + start)
    total = start + chunk
    k_cache, v_cache, table, k, v = scattered_pool(total, block_size, gen)
    q = torch.randn(chunk, NH, HD, generator=gen)
    ck, cv = gather_kv(k_cache, v_cache, table, total)
    assert torch.equal(ck, k) and torch.equal(cv, v)
    got = prefill_attention(q, ck, cv, start, HD ** -0.5)
    torch.testing.assert_close(got, dense_causal(q, k, v, start), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_batched_decode_over_ragged_contexts_matches_dense(block_size):
    gen = torch.Generator().manual_seed(block_size)
    lengths = [1, 7, 33, 16]
    pools = [scattered_pool(n, block_size, gen) for n in lengths]
    # put all sequences in one shared pool, as the engine does
    num_blocks = sum(p[0].shape[0] for p in pools)
    k_cache = torch.zeros(num_blocks, block_size, KVH, HD)
    v_cache = torch.zeros_like(k_cache)
    tables, offset = [], 0
    for kc, vc, table, _, _ in pools:
        k_cache[offset:offset + kc.shape[0]] = kc
        v_cache[offset:offset + vc.shape[0]] = vc
        tables.append((table + offset).tolist())
        offset += kc.shape[0]
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    q = torch.randn(len(lengths), NH, HD, generator=gen)
    got = paged_decode_attention(q, k_cache, v_cache, padded, torch.tensor(lengths), HD ** -0.5)
    for i, (n, (_, _, _, k, v)) in enumerate(zip(lengths, pools)):
        want = dense_causal(q[i:i + 1], k, v, start=n - 1)[0]
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-5)
