"""batchtop's C++ CPU kernels against the torch code they replace, side by side in one run.

    python bench/cpu_kernels.py [--threads 1] [--dtype bfloat16]

cpu-demo's shapes (16 heads, 4 KV heads, head_dim 64, hidden 1024, intermediate 2816, block 16):
- decode attention for 16 sequences at several contexts: the kernel reading the pool in place vs the
  reference (gather every block table into a dense copy, SDPA with a mask);
- one prompt chunk at several lengths, fresh and continuing after 128 cached tokens: the kernel's
  varlen rows vs SDPA (with the gather the continuation needs);
- the decoder layer's elementwise steps at 8 and 64 rows: RMSNorm, residual add + RMSNorm, SiLU-and-mul
  and RoPE as fused passes vs the torch ops;
- SmolLM2's four layer GEMMs (qkv, o_proj, gate_up with SiLU-and-mul, down_proj) over 30 layers of
  cold weights, at 2, 8, 16 and 84 rows: the kernel vs F.linear (oneDNN), and the kernel's GFLOP/s;
- decode attention over a cold pool in SmolLM2's shapes (9 heads on 3 KV heads, 30 layers of 1024
  blocks in random order, far more than the caches hold): the rate the kernel reads the pool at vs
  a contiguous copy of as many bytes, the rate this machine streams memory at.
Each pair is timed alternately (median of rounds), so a noisy neighbour hits both; the ratio is what
counts.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from batchtop.core_engine.model.llama import apply_rope, rope_cos_sin
from batchtop.gpu_kernels import cpu_kernels, decode_mask, gather_kv, paged_decode_attention, prefill_attention

NH, KVH, HD, BS, HIDDEN, INTER = 16, 4, 64, 16, 1024, 2816


def timed(fn, reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def alternated(ours, theirs, rounds: int = 5, reps: int = 20) -> tuple[float, float]:
    """Median seconds of each, timed in alternating rounds so that a noisy neighbour hits both."""
    a, b = [], []
    for _ in range(rounds):
        a.append(timed(ours, reps))
        b.append(timed(theirs, reps))
    return statistics.median(a), statistics.median(b)


def pair(label: str, ours, theirs, rounds: int = 5, reps: int = 20) -> None:
    mine, ref = (1e3 * t for t in alternated(ours, theirs, rounds, reps))
    print(f"  {label:<44} kernel {mine:8.3f} ms   torch {ref:8.3f} ms   {ref / mine:5.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    args = ap.parse_args()
    if not cpu_kernels.available():
        raise SystemExit(f"the CPU kernels are not built here: {cpu_kernels.why_unavailable()}")
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.randn(2048, BS, KVH, HD, generator=gen).to(dtype)
    v_cache = torch.randn(2048, BS, KVH, HD, generator=gen).to(dtype)
    print(f"{args.dtype}, {args.threads} thread(s); cpu-demo shapes")

    print("decode attention, 16 sequences:")
    q = torch.randn(16, NH, HD, generator=gen).to(dtype)
    for ctx in (32, 128, 512):
        tables = torch.randperm(2048, generator=gen)[:16 * (ctx // BS)].view(16, ctx // BS)
        lens = torch.full((16,), ctx)
        mask = decode_mask(tables, lens, BS)
        pair(f"context {ctx}", lambda: cpu_kernels.paged_attention(q, k_cache, v_cache, tables, None, lens, HD ** -0.5),
             lambda: paged_decode_attention(q, k_cache, v_cache, tables, lens, HD ** -0.5, mask))

    print("one prompt chunk:")
    for n in (16, 64, 256):
        qc = torch.randn(n, NH, HD, generator=gen).to(dtype)
        k, v = torch.randn(n, KVH, HD, generator=gen).to(dtype), torch.randn(n, KVH, HD, generator=gen).to(dtype)
        table = torch.randperm(2048, generator=gen)[:(128 + n) // BS + 1]
        rows = torch.zeros(n, dtype=torch.long)
        lens = torch.arange(1, n + 1)
        pair(f"{n} tokens, fresh",
             lambda: cpu_kernels.paged_attention(qc, k_cache, v_cache, table[None], rows, lens, 0.125),
             lambda: prefill_attention(qc, k, v, 0, 0.125))
        pair(f"{n} tokens after 128 cached",
             lambda: cpu_kernels.paged_attention(qc, k_cache, v_cache, table[None], rows, lens + 128, 0.125),
             lambda: prefill_attention(qc, *gather_kv(k_cache, v_cache, table, 128 + n), 128, 0.125))

    print("elementwise steps of one decoder layer:")
    w = torch.ones(HIDDEN, dtype=dtype)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, HD, 2, dtype=torch.float32) / HD))
    for rows in (8, 64):
        x = torch.randn(rows, HIDDEN, generator=gen).to(dtype)
        h = torch.randn(rows, HIDDEN, generator=gen).to(dtype)
        gate_up = torch.randn(rows, 2 * INTER, generator=gen).to(dtype)
        qk = torch.randn(rows, NH + KVH, HD, generator=gen).to(dtype)
        cos, sin = rope_cos_sin(torch.arange(rows), inv_freq, dtype)
        pair(f"{rows} rows: RMSNorm", lambda: cpu_kernels.rms_norm(x, w, 1e-5),
             lambda: F.rms_norm(x, (HIDDEN,), w, 1e-5))
        pair(f"{rows} rows: residual add + RMSNorm", lambda: cpu_kernels.add_rms_norm(x.clone(), h, w, 1e-5),
             lambda: F.rms_norm(x.clone() + h, (HIDDEN,), w, 1e-5))
        pair(f"{rows} rows: SiLU(gate) * up", lambda: cpu_kernels.silu_and_mul(gate_up),
             lambda: F.silu(gate_up[:, :INTER]) * gate_up[:, INTER:])
        pair(f"{rows} rows: RoPE on q and k", lambda: cpu_kernels.rope_(qk, cos, sin), lambda: apply_rope(qk, cos, sin))
    del k_cache, v_cache
    if dtype == torch.bfloat16 and cpu_kernels.linear_bf16_usable():
        layer_gemms(gen)
    cold_pool(dtype, gen)


def layer_gemms(gen: torch.Generator) -> None:
    """A SmolLM2 step's 120 layer GEMMs, each weight read from DRAM: 212 MB, more than the caches hold."""
    hidden, inter, qkv = 576, 1536, 960
    shapes = [(qkv, hidden, False), (hidden, hidden, False), (2 * inter, hidden, True), (hidden, inter, False)]
    layers = []
    for _ in range(30):
        layer = []
        for n, k, halves in shapes:
            w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
            packed = cpu_kernels.pack_linear_bf16(w, n // 2 if halves else 0)
            layer.append((w, packed, n, halves))
        layers.append(layer)
    flops_per_row = 2 * 30 * sum(n * k for n, k, _ in shapes)
    print("SmolLM2's layer GEMMs, 30 layers of cold weights (F.linear: oneDNN; the SiLU-and-mul apart):")
    for rows in (2, 8, 16, 84):
        xs = {k: torch.randn(rows, k, generator=gen).to(torch.bfloat16) for k in (hidden, inter)}

        def ours():
            for layer in layers:
                for w, packed, n, halves in layer:
                    if halves:
                        cpu_kernels.silu_mul_linear_bf16(xs[w.shape[1]], packed, None, n // 2)
                    else:
                        cpu_kernels.linear_bf16(xs[w.shape[1]], packed, None, n)

        def theirs():
            for layer in layers:
                for w, _, n, halves in layer:
                    y = F.linear(xs[w.shape[1]], w)
                    if halves:
                        cpu_kernels.silu_and_mul(y)

        mine, ref = alternated(ours, theirs, rounds=5, reps=1)
        print(f"  {rows:2d} rows: kernel {1e3 * mine:7.2f} ms ({rows * flops_per_row / mine / 1e9:4.0f} GFLOP/s)   "
              f"F.linear {1e3 * ref:7.2f} ms   {ref / mine:5.2f}x")


def cold_pool(dtype: torch.dtype, gen: torch.Generator) -> None:
    """A decode step's attention over all 30 layers, each layer's pool evicted by the others."""
    heads, kv_heads, layers, blocks = 9, 3, 30, 1024
    pools = [(torch.randn(blocks, BS, kv_heads, HD, generator=gen).to(dtype),
              torch.randn(blocks, BS, kv_heads, HD, generator=gen).to(dtype)) for _ in range(layers)]
    print(f"decode attention over a cold pool, SmolLM2 shapes ({layers} layers, blocks in random order):")
    for rows, ctx in ((16, 128), (16, 512), (2, 1024), (1, 2000)):
        n = ctx // BS
        tables = torch.randperm(blocks, generator=gen)[:rows * n].view(rows, n)
        lens = torch.full((rows,), ctx)
        q = torch.randn(rows, heads, HD, generator=gen).to(dtype)
        nbytes = 2 * rows * ctx * kv_heads * HD * q.element_size() * layers
        src = torch.empty(nbytes // 2, dtype=torch.int16)  # as many bytes, read once, front to back
        dst = torch.empty_like(src)

        def attend():
            for k, v in pools:
                cpu_kernels.paged_attention(q, k, v, tables, None, lens, HD ** -0.5)

        t, c = alternated(attend, lambda: dst.copy_(src), rounds=7, reps=1)
        print(f"  {rows:2d} rows, context {ctx:4d}: {1e3 * t:6.2f} ms a step, {nbytes / t / 1e9:5.1f} GB/s read; "
              f"a contiguous copy {2 * nbytes / c / 1e9:5.1f} GB/s (read + write)")


if __name__ == "__main__":
    main()
