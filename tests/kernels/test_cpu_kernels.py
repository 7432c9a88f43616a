"""batchtop's C++ CPU kernels against the torch code they replace: paged attention reads the pool in
place (decode rows over ragged contexts, prompt rows through row_tables), the fused elementwise ops
round as Hugging Face's do, the sampler draws the nucleus, and bad calls name what is wrong."""

from __future__ import annotations

import pytest
import torch

from batchtop.gpu_kernels import cpu_kernels, decode_mask, gather_kv, paged_decode_attention, prefill_attention

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"CPU kernel not built: {cpu_kernels.why_unavailable()}")

# head_dim 64 and 128 take the vectorised path (on AVX-512 CPUs), 16 and 40 the portable one; 10 heads
# on 2 a group size the kernels have no fixed case for
SHAPES = [(4, 2, 16), (8, 2, 40), (16, 4, 64), (8, 1, 128), (12, 4, 64), (10, 2, 64)]
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def pool(num_blocks: int, block_size: int, kvh: int, hd: int, dtype: torch.dtype, gen: torch.Generator):
    k = torch.randn(num_blocks, block_size, kvh, hd, generator=gen).to(dtype)
    v = torch.randn(num_blocks, block_size, kvh, hd, generator=gen).to(dtype)
    return k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("nh,kvh,hd", SHAPES)
@pytest.mark.parametrize("block_size", [1, 5, 16])
def test_decode_rows_match_the_reference(dtype, nh, kvh, hd, block_size):
    gen = torch.Generator().manual_seed(nh * hd + block_size)
    lengths = torch.tensor([1, 17, 40, 3, 16, 33])
    width = int(-(-lengths.max() // block_size))
    k_cache, v_cache = pool(width * len(lengths) + 3, block_size, kvh, hd, dtype, gen)
    tables = torch.randperm(k_cache.shape[0], generator=gen)[:width * len(lengths)].view(len(lengths), width)
    q = torch.randn(len(lengths), nh, hd, generator=gen).to(dtype)
    scale = hd ** -0.5
    got = cpu_kernels.paged_attention(q, k_cache, v_cache, tables, None, lengths, scale)
    want = paged_decode_attention(q.float(), k_cache.float(), v_cache.float(), tables, lengths, scale)
    torch.testing.assert_close(got.float(), want, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hd", [64, 128])
def test_a_long_context_whose_scores_rise_to_the_end_matches_the_reference(dtype, hd):
    """Each new tile of keys outscores the last, so a one-pass softmax rescales what it has summed at
    every tile; a wrong rescale shows as weight left on the early keys."""
    gen = torch.Generator().manual_seed(hd)
    nh, kvh, block_size, n = 6, 2, 16, 700
    k_cache, v_cache = pool(n // block_size + 8, block_size, kvh, hd, dtype, gen)
    tables = torch.randperm(k_cache.shape[0], generator=gen)[:-(-n // block_size)].view(1, -1)
    q = torch.randn(1, nh, hd, generator=gen).to(dtype)
    rising = torch.linspace(0.0, 12.0, n).to(dtype)  # the score of key t grows with t
    keys = torch.zeros(n, kvh, hd)
    for h in range(kvh):
        keys[:, h] = rising[:, None].float() * q[0, h * (nh // kvh)].float() / q[0, h * (nh // kvh)].float().norm() ** 2
    flat = k_cache.view(-1, kvh, hd)
    slots = (tables[0, :, None] * block_size + torch.arange(block_size)).flatten()[:n]
    flat[slots] = keys.to(dtype)
    got = cpu_kernels.paged_attention(q, k_cache, v_cache, tables, None, torch.tensor([n]), 1.0)
    want = paged_decode_attention(q.float(), k_cache.float(), v_cache.float(), tables, torch.tensor([n]), 1.0)
    torch.testing.assert_close(got.float(), want, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("nh,kvh,hd", [(4, 2, 16), (16, 4, 64)])
def test_prompt_chunks_of_several_sequences_in_one_call_match_causal_attention(dtype, nh, kvh, hd):
    """Rows of two sequences' chunks (one fresh, one continuing after 21 cached tokens), each row
    attending to its own prefix: what SDPA computes chunk by chunk."""
    gen = torch.Generator().manual_seed(hd)
    block_size = 4
    k_cache, v_cache = pool(40, block_size, kvh, hd, dtype, gen)
    tables = torch.randperm(40, generator=gen)[:2 * 12].view(2, 12)
    chunks = [(0, 0, 9), (1, 21, 6)]  # (table, context start, tokens)
    q = torch.randn(sum(n for _, _, n in chunks), nh, hd, generator=gen).to(dtype)
    row_tables = torch.tensor([t for t, _, n in chunks for _ in range(n)])
    lens = torch.tensor([start + i + 1 for _, start, n in chunks for i in range(n)])
    got = cpu_kernels.paged_attention(q, k_cache, v_cache, tables, row_tables, lens, hd ** -0.5)
    row = 0
    for table, start, n in chunks:
        ck, cv = gather_kv(k_cache.float(), v_cache.float(), tables[table], start + n)
        want = prefill_attention(q[row:row + n].float(), ck, cv, start, hd ** -0.5)
        torch.testing.assert_close(got[row:row + n].float(), want, **TOLERANCE[dtype])
        row += n


def test_strided_query_and_table_views_are_read_where_they_point():
    """The model hands q as a slice of its fused q/k tensor and the tables as a slice of the
    persistent decode table: neither is contiguous."""
    gen = torch.Generator().manual_seed(3)
    k_cache, v_cache = pool(30, 16, 4, 64, torch.float32, gen)
    qk = torch.randn(3, 16 + 4, 64, generator=gen)
    q = qk[:, :16]
    full = torch.randperm(30, generator=gen)[:3 * 8].view(3, 8)
    tables = full[:, :3]
    lens = torch.tensor([5, 48, 20])
    got = cpu_kernels.paged_attention(q, k_cache, v_cache, tables, None, lens, 0.125)
    want = paged_decode_attention(q.contiguous(), k_cache, v_cache, tables.contiguous(), lens, 0.125,
                                  decode_mask(tables, lens, 16))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_row_is_the_same_whatever_shares_its_batch():
    gen = torch.Generator().manual_seed(4)
    k_cache, v_cache = pool(64, 16, 4, 64, torch.bfloat16, gen)
    tables = torch.randperm(64, generator=gen)[:8 * 8].view(8, 8)
    q = torch.randn(8, 16, 64, generator=gen).to(torch.bfloat16)
    lens = torch.tensor([100, 3, 77, 128, 1, 64, 90, 12])
    batch = cpu_kernels.paged_attention(q, k_cache, v_cache, tables, None, lens, 0.125)
    for r in range(8):
        alone = cpu_kernels.paged_attention(q[r:r + 1], k_cache, v_cache, tables[r:r + 1], None, lens[r:r + 1], 0.125)
        assert torch.equal(alone[0], batch[r])


@pytest.mark.parametrize("num_threads", [1, 2, 3, 7])
def test_every_row_is_computed_and_the_same_however_many_threads_share_the_rows(num_threads):
    """The rows are split between threads by the keys they read, not by count: one long row among
    short ones, zero-length rows, and more threads than rows still give every row, bit for bit."""
    gen = torch.Generator().manual_seed(5)
    k_cache, v_cache = pool(80, 16, 2, 64, torch.bfloat16, gen)
    lens = torch.tensor([900, 0, 1, 2, 3, 0, 40, 5])
    tables = torch.randint(0, 80, (8, 57), generator=gen)  # rows may share blocks: they only read them
    q = torch.randn(8, 6, 64, generator=gen).to(torch.bfloat16)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = cpu_kernels.paged_attention(q, k_cache, v_cache, tables, None, lens, 0.125)
        torch.set_num_threads(num_threads)
        shared = cpu_kernels.paged_attention(q, k_cache, v_cache, tables, None, lens, 0.125)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(shared, alone)
    want = paged_decode_attention(q.float(), k_cache.float(), v_cache.float(), tables, lens.clamp(min=1), 0.125)
    live = lens > 0
    torch.testing.assert_close(shared[live].float(), want[live], **TOLERANCE[torch.bfloat16])
    assert not shared[~live].any()  # nothing to attend to: zeros


def test_a_bad_call_names_what_is_wrong():
    k_cache = torch.zeros(4, 16, 2, 64)
    q = torch.zeros(2, 4, 64)
    with pytest.raises(RuntimeError, match="row_tables"):
        cpu_kernels.paged_attention(q, k_cache, k_cache, torch.zeros(2, 1, dtype=torch.long),
                                      torch.zeros(3, dtype=torch.long), torch.ones(2, dtype=torch.long), 1.0)
    with pytest.raises(RuntimeError, match="dtype"):
        cpu_kernels.paged_attention(q.to(torch.bfloat16), k_cache, k_cache, torch.zeros(2, 1, dtype=torch.long),
                                      None, torch.ones(2, dtype=torch.long), 1.0)


@pytest.mark.skipif(not cpu_kernels.linear_bf16_usable(), reason="needs AVX512_BF16")
def test_a_bad_linear_call_names_what_is_wrong():
    packed = cpu_kernels.pack_linear_bf16(torch.zeros(80, 32, dtype=torch.bfloat16))
    x = torch.zeros(3, 32, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="34 features"):  # x of 34 against a weight of 32
        cpu_kernels.linear_bf16(torch.zeros(3, 34, dtype=torch.bfloat16), packed, None, 80)
    with pytest.raises(RuntimeError, match="weight's N"):
        cpu_kernels.linear_bf16(x, packed, None, 200)
    with pytest.raises(RuntimeError, match="bias"):
        cpu_kernels.linear_bf16(x, packed, torch.zeros(79, dtype=torch.bfloat16), 80)
    with pytest.raises(RuntimeError, match="bfloat16"):
        cpu_kernels.pack_linear_bf16(torch.zeros(80, 32))


def test_the_engine_on_the_kernel_generates_what_it_generates_on_the_reference(monkeypatch):
    """head_dim 64 (the vectorised path), chunked prompts continuing over cached blocks, decode rows
    and prompt rows in one call: the same greedy tokens as the torch reference path, in fp32."""
    from dataclasses import replace

    from batchtop.core_engine.engine.engine import Engine
    from tests.conftest import make_requests, run_all, tiny_config

    model = replace(tiny_config().model, hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                    head_dim=64, vocab_size=512)
    config = tiny_config(model=model, max_num_seqs=4, max_num_batched_tokens=24, block_size=16)
    requests = make_requests(8, seed=5, prompt=(3, 60), output=(6, 20))
    kernel = Engine(config)
    assert kernel.runner.varlen_prompts
    on_kernel, snaps, _ = run_all(kernel, requests)
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in snaps)  # mixed steps happened

    monkeypatch.setattr(cpu_kernels, "usable", lambda dtype, head_dim: False)
    reference = Engine(config)
    assert not reference.runner.varlen_prompts
    on_reference, _, _ = run_all(reference, requests)
    assert on_kernel == on_reference


def hf_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: normalise in fp32, round to the dtype, then scale."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


# bf16 results may differ from torch's by one rounding step where fp32 intermediates differ in the last bit
FUSED_TOLERANCE = {torch.float32: dict(rtol=1e-6, atol=1e-6), torch.bfloat16: dict(rtol=8e-3, atol=8e-3)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 1000, 1024])  # 1000: a tail past the last full vector
def test_fused_norms_match_hugging_faces_rounding(dtype, hidden):
    gen = torch.Generator().manual_seed(hidden)
    x = (torch.randn(5, hidden, generator=gen) * 3).to(dtype)
    h = torch.randn(5, hidden, generator=gen).to(dtype)
    w = (1 + torch.randn(hidden, generator=gen) * 0.1).to(dtype)
    torch.testing.assert_close(cpu_kernels.rms_norm(x, w, 1e-5), hf_rms_norm(x, w, 1e-5), **FUSED_TOLERANCE[dtype])
    residual = x.clone()
    normed = cpu_kernels.add_rms_norm(residual, h, w, 1e-5)
    assert torch.equal(residual, x + h)  # the residual stream, rounded as torch's add rounds it
    torch.testing.assert_close(normed, hf_rms_norm(x + h, w, 1e-5), **FUSED_TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [40, 2816])
def test_silu_and_mul_matches_torch(dtype, width):
    gen = torch.Generator().manual_seed(width)
    gate_up = (torch.randn(7, 2 * width, generator=gen) * 4).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(cpu_kernels.silu_and_mul(gate_up), torch.nn.functional.silu(gate) * up,
                               **FUSED_TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_in_place_on_a_strided_view_matches_apply_rope(dtype):
    from batchtop.core_engine.model.llama import apply_rope, rope_cos_sin

    gen = torch.Generator().manual_seed(9)
    qkv = torch.randn(6, (4 + 2 + 2) * 64, generator=gen).to(dtype)
    qk = qkv[:, :6 * 64].view(6, 6, 64)  # q and k heads of the fused projection, v left alone
    cos, sin = rope_cos_sin(torch.tensor([0, 1, 5, 17, 100, 4000]), 1.0 / (10000 ** (torch.arange(0, 64, 2) / 64)),
                            dtype)
    want = apply_rope(qk.clone(), cos, sin)
    v_before = qkv[:, 6 * 64:].clone()
    cpu_kernels.rope_(qk, cos, sin)
    torch.testing.assert_close(qk, want, **FUSED_TOLERANCE[dtype])
    assert torch.equal(qkv[:, 6 * 64:], v_before)


@pytest.mark.parametrize("top_p", [0.5, 0.9, 1.0])
def test_the_sampling_kernel_draws_the_renormalised_nucleus_and_never_leaves_it(top_p):
    from tests.worker.test_sampling import nucleus, rows_batch

    vocab = 40  # past two full vectors, so the vectorised passes and their tails both count
    logits = torch.linspace(2.0, -1.0, vocab) + torch.tensor([0.3, -0.3] * (vocab // 2))
    n = 20000
    b = rows_batch(n, top_p)
    tokens = cpu_kernels.sample(logits.expand(n, vocab).contiguous(), b.temperature, b.top_p, b.seed_lo, b.seed_hi,
                                b.counter)
    want = nucleus(torch.softmax(logits, dim=0), top_p)
    got = torch.bincount(tokens, minlength=vocab).float() / n
    assert torch.all(got[want == 0] == 0)
    assert (got - want).abs().max() < 0.015


def test_the_sampling_kernel_keeps_every_tied_token_at_the_boundary_and_greedy_rows_exact():
    from tests.worker.test_sampling import rows_batch

    logits = torch.tensor([0.4, 0.2, 0.2, 0.2]).log().expand(4000, 4).contiguous()
    b = rows_batch(4000, 0.5)
    drawn = cpu_kernels.sample(logits, b.temperature, b.top_p, b.seed_lo, b.seed_hi, b.counter)
    assert set(drawn.tolist()) == {0, 1, 2, 3}
    wide = torch.randn(9, 1000, generator=torch.Generator().manual_seed(1)).bfloat16()
    wide[3, 10] = wide[3, 700] = 50.0  # a tie: the first maximum wins, as torch's argmax
    assert torch.equal(cpu_kernels.argmax(wide), wide.argmax(dim=-1))
    temperature = torch.tensor([0.0, 1.0] * 4 + [0.0])
    got = cpu_kernels.sample(wide, temperature, torch.full((9,), 0.9), torch.arange(9),
                             torch.zeros(9, dtype=torch.long), torch.full((9,), 4))
    assert torch.equal(got[temperature == 0], wide.argmax(dim=-1)[temperature == 0])


def test_a_seeded_row_draws_the_same_token_whatever_its_neighbours():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 3000, generator=gen).bfloat16()
    args = (torch.full((6,), 0.8), torch.full((6,), 0.9), torch.arange(6) * 7, torch.zeros(6, dtype=torch.long),
            torch.arange(6) + 30)
    batch = cpu_kernels.sample(logits, *args)
    for r in range(6):
        alone = cpu_kernels.sample(logits[r:r + 1], *(a[r:r + 1] for a in args))
        assert alone.item() == batch[r].item()
