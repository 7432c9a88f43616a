"""Every prompt chunk of a step in one SDPA call (gpu_kernels/attention/padded_sdpa.py) gives what each
chunk gives alone through the readable per-chunk reference, for fresh and continuation chunks, GQA
groups, block sizes and static batching's padding chunks; and it runs on a fused SDPA kernel, never
on the math fallback."""

from __future__ import annotations

import random

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from batchtop.gpu_kernels import gather_kv, prefill_attention, store_kv
from batchtop.core_engine.model.attention_batch import PrefillChunk
from batchtop.gpu_kernels.attention import plan_prefill
from batchtop.gpu_kernels.attention.padded_sdpa import padded_prefill_attention

HD = 16
FUSED_ONLY = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


def step_with_chunks(specs, heads, block_size, dtype=torch.float32, seed=0):
    """A pool holding several sequences and one step's prompt chunks over them, K/V already stored as
    the model stores it. specs: (context_start, num_tokens) per chunk; None as context_start: a static
    batch's padding chunk (start 0, a one-block scratch table its K/V wraps around in)."""
    nh, kvh = heads
    gen = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-((c or 0) + n) // block_size) for c, n in specs]
    num_blocks = sum(blocks_needed) + 3
    scratch = num_blocks - 1
    k_cache = torch.randn(num_blocks, block_size, kvh, HD, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kvh, HD, generator=gen).to(dtype)
    order = torch.randperm(num_blocks - 1, generator=gen).tolist()
    chunks, row = [], 0
    total = sum(n for _, n in specs)
    q = torch.randn(total, nh, HD, generator=gen).to(dtype)
    k = torch.randn(total, kvh, HD, generator=gen).to(dtype)
    v = torch.randn(total, kvh, HD, generator=gen).to(dtype)
    slots = []
    for (start, n), need in zip(specs, blocks_needed):
        if start is None:
            table = torch.tensor([scratch])
            slots += [scratch * block_size + p % block_size for p in range(n)]
            start = 0
        else:
            table = torch.tensor([order.pop() for _ in range(need)])
            slots += [table[p // block_size].item() * block_size + p % block_size for p in range(start, start + n)]
        chunks.append(PrefillChunk(row, n, start, table))
        row += n
    store_kv(k, v, k_cache, v_cache, torch.tensor(slots))
    return q, k, v, k_cache, v_cache, chunks


def chunk_by_chunk(q, k, v, k_cache, v_cache, chunks, scale):
    """The per-chunk reference loop the batched call replaces (fresh K/V for a chunk with nothing cached)."""
    out = torch.empty_like(q)
    for c in chunks:
        rows = slice(c.token_start, c.token_start + c.num_tokens)
        if c.context_start == 0:
            ck, cv = k[rows], v[rows]
        else:
            ck, cv = gather_kv(k_cache, v_cache, c.block_table, c.context_start + c.num_tokens)
        out[rows] = prefill_attention(q[rows].float(), ck.float(), cv.float(), c.context_start, scale).to(q.dtype)
    return out


SPECS = {
    "fresh prompts": [(0, 7), (0, 1), (0, 12)],
    "continuations": [(5, 3), (0, 9), (17, 1), (2, 6)],
    "one long continuation": [(40, 13)],
    "padding chunks": [(None, 11), (0, 4), (None, 3), (6, 5)],
}


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (8, 2)], ids=["mha", "gqa2", "gqa4"])
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_one_call_equals_each_chunk_alone(spec, block_size, heads):
    q, k, v, k_cache, v_cache, chunks = step_with_chunks(spec, heads, block_size, seed=block_size)
    plan = plan_prefill(chunks, block_size, q.device)
    assert plan.num_chunks == len(spec) and plan.query_start_loc.tolist()[-1] == q.shape[0]
    scale = HD ** -0.5
    got = padded_prefill_attention(q, k, v, k_cache, v_cache, plan, scale)
    want = chunk_by_chunk(q, k, v, k_cache, v_cache, chunks, scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("spec", [SPECS["fresh prompts"], SPECS["continuations"]], ids=["causal", "masked"])
def test_prefill_never_takes_the_math_backend(spec, dtype, device):
    """Only flash and memory-efficient attention are allowed: SDPA raises if the call needs the math
    fallback. torch's CPU flash kernel takes both the causal and the boolean-mask form; on CUDA flash
    takes the causal GQA form and the memory-efficient kernel the masked one (the engine's CUDA dtype is
    bf16; CUDA has no fused kernel for fp32 causal GQA, so fp32 is checked on the CPU only)."""
    if device == "cuda" and dtype == torch.float32:
        pytest.skip("fp32 on CUDA: flash needs fp16/bf16; only the engine's bf16 is required to be fused")
    q, k, v, k_cache, v_cache, chunks = step_with_chunks(spec, (4, 2), 4, dtype)
    want = chunk_by_chunk(q, k, v, k_cache, v_cache, chunks, HD ** -0.5)
    q, k, v, k_cache, v_cache = (t.to(device) for t in (q, k, v, k_cache, v_cache))
    for c in chunks:
        c.block_table = c.block_table.to(device)
    plan = plan_prefill(chunks, 4, q.device)
    with sdpa_kernel(FUSED_ONLY):
        got = padded_prefill_attention(q, k, v, k_cache, v_cache, plan, HD ** -0.5)
    assert got.dtype == dtype  # computed in the model's dtype, not an fp32 copy
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.cpu(), want, **tol)


def test_the_varlen_tables_follow_the_kernel_contract():
    """query_start_loc, context_starts and block tables wide enough for every chunk's last position (a
    padding chunk's one-block scratch table included): what paged_prefill_attention_triton reads."""
    spec = [(5, 3), (None, 9), (0, 2)]
    q, k, v, k_cache, v_cache, chunks = step_with_chunks(spec, (4, 2), 4)
    plan = plan_prefill(chunks, 4, q.device)
    assert plan.query_start_loc.dtype == torch.int32 and plan.query_start_loc.tolist() == [0, 3, 12, 14]
    assert plan.context_starts.tolist() == [5, 0, 0]
    assert plan.block_tables.shape == (3, 3)  # ceil(9 / 4): the padding chunk's positions 0..8
    assert plan.block_tables[0, :2].tolist() == chunks[0].block_table.tolist()
    assert plan.block_tables[1, 0].item() == chunks[1].block_table[0].item()


def test_random_steps_match_the_reference():
    rng = random.Random(3)
    for trial in range(12):
        spec = [(rng.choice([0, 0, rng.randrange(1, 30)]), rng.randrange(1, 14)) for _ in range(rng.randrange(1, 6))]
        block_size = rng.choice([2, 4, 8])
        q, k, v, k_cache, v_cache, chunks = step_with_chunks(spec, (6, 3), block_size, seed=trial)
        plan = plan_prefill(chunks, block_size, q.device)
        got = padded_prefill_attention(q, k, v, k_cache, v_cache, plan, 0.3)
        torch.testing.assert_close(got, chunk_by_chunk(q, k, v, k_cache, v_cache, chunks, 0.3),
                                   rtol=1e-5, atol=1e-5, msg=lambda m: f"{spec}, block {block_size}: {m}")
