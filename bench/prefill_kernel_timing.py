"""The Triton varlen paged prefill kernel timed per layer call on CUDA, against torch SDPA in bf16 (4-D).

    python bench/prefill_kernel_timing.py       # gpu-8b dims: one 2048-token prompt; 8 chunks of 256 after 256 cached

Per shape: the kernel reads K/V in place through shuffled block tables (block 16) with q a view of the
fused qkv projection, as the engine calls it; SDPA gets its best case, untimed: K/V already gathered
dense and repeated to every query head, q already (chunks, heads, rows, hd), and the causal mask as
torch's lower-right CausalBias, restricted to the flash / memory-efficient backends (never the math
fallback; an error says so if neither applies). Each is timed as CALLS back-to-back calls between
torch.cuda events, median of REPLAYS. FLOPs count only the (query, key) pairs the causal mask keeps
(4 x heads x head_dim each: the score and the value dot); the fraction is of the device's bf16 compute
roof. Also: the largest difference between the kernel's output and SDPA's. Imported by
bench/gpu_suite.py (its prefill_kernel section).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from batchtop.core_engine.config import preset
from batchtop.core_engine.perf.device_peaks import device_peaks
from batchtop.gpu_kernels.triton_prefill import paged_prefill_attention_triton, tile_shape

SHAPES = {"1x2048+0": ([2048], [0]), "8x256+256": ([256] * 8, [256] * 8)}  # rows, cached tokens per chunk
CALLS = 16
REPLAYS = 7


def prefill_step(rows: list[int], contexts: list[int], heads: int, kv_heads: int, head_dim: int, block_size: int,
                 seed: int = 0, device: str = "cuda", dtype: torch.dtype = torch.bfloat16) -> dict:
    """The kernel's inputs (a shuffled pool, int32 tables) and SDPA's dense 4-D equivalents."""
    gen = torch.Generator(device=device).manual_seed(seed)
    need = [-(-(c + n) // block_size) for c, n in zip(contexts, rows)]
    num_blocks = sum(need) + 1
    k_cache, v_cache = (torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen, device=device).to(dtype)
                        for _ in range(2))
    order = torch.randperm(num_blocks, generator=gen, device=device)
    tables = torch.full((len(rows), max(need)), int(order[-1]), dtype=torch.int32, device=device)
    used = 0
    for s, blocks in enumerate(need):
        tables[s, :blocks] = order[used:used + blocks].int()
        used += blocks
    fused = torch.randn(sum(rows), heads + 2 * kv_heads, head_dim, generator=gen, device=device).to(dtype)
    q = fused[:, :heads]
    starts = torch.tensor([0, *torch.tensor(rows).cumsum(0).tolist()], dtype=torch.int32, device=device)
    ctx = torch.tensor(contexts, dtype=torch.int32, device=device)

    group = heads // kv_heads
    total = contexts[0] + rows[0]
    assert all(c + n == total for c, n in zip(contexts, rows)), "SDPA's 4-D batch needs equal chunks"

    def dense(cache: torch.Tensor) -> torch.Tensor:  # (chunks, heads, keys, hd)
        keys = cache[tables.long()].view(len(rows), -1, kv_heads, head_dim)[:, :total]
        return keys.repeat_interleave(group, dim=2).transpose(1, 2).contiguous()
    q4 = q.reshape(len(rows), rows[0], heads, head_dim).transpose(1, 2).contiguous()
    return {"kernel_args": (q, k_cache, v_cache, tables, starts, ctx), "q4": q4, "k4": dense(k_cache),
            "v4": dense(v_cache), "rows": rows, "contexts": contexts}


def causal_flops(rows: list[int], contexts: list[int], heads: int, head_dim: int) -> int:
    """Row i of a chunk after c cached tokens sees c + i + 1 keys; each (query, key) pair costs two dots."""
    pairs = sum(n * c + n * (n + 1) // 2 for n, c in zip(rows, contexts))
    return 4 * heads * head_dim * pairs


def time_us(call) -> float:
    call()  # compile / pick the backend outside the timing
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(REPLAYS):
        start.record()
        for _ in range(CALLS):
            call()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / CALLS)
    return round(statistics.median(samples), 2)


def prefill_kernel_timing(model: str = "gpu-8b", block_size: int = 16) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    cfg = preset(model)
    heads, kv_heads, head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    peak = device_peaks("cuda", "bfloat16").peak_flops
    scale = head_dim ** -0.5
    block_m, block_n, warps = tile_shape(heads // kv_heads, head_dim, torch.bfloat16)
    out = {"model": model, "block_size": block_size, "peak_flops": peak, "calls": CALLS,
           "tile": {"block_m": block_m, "block_n": block_n, "num_warps": warps}, "shapes": {}}
    for name, (rows, contexts) in SHAPES.items():
        step = prefill_step(rows, contexts, heads, kv_heads, head_dim, block_size)
        bias = causal_lower_right(rows[0], contexts[0] + rows[0])

        def kernel():
            return paged_prefill_attention_triton(*step["kernel_args"], scale)

        def sdpa():
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
                return F.scaled_dot_product_attention(step["q4"], step["k4"], step["v4"], attn_mask=bias, scale=scale)
        got = kernel().float()
        want = sdpa().transpose(1, 2).reshape(got.shape).float()
        flops = causal_flops(rows, contexts, heads, head_dim)
        new_us, sdpa_us = time_us(kernel), time_us(sdpa)
        out["shapes"][name] = {
            "rows": sum(rows), "chunks": len(rows), "cached_per_chunk": contexts[0], "flops": flops,
            "kernel_us": new_us, "sdpa_us": sdpa_us, "speedup_vs_sdpa": round(sdpa_us / new_us, 2),
            "kernel_fraction_of_compute_roof": round(flops / (new_us * 1e-6) / peak, 3),
            "sdpa_fraction_of_compute_roof": round(flops / (sdpa_us * 1e-6) / peak, 3),
            "max_abs_diff_vs_sdpa": (got - want).abs().max().item(), "kernel_has_nan": bool(got.isnan().any())}
        del step
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpu-8b")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device (torch.cuda.is_available() is False)")
    print(json.dumps(prefill_kernel_timing(args.model), indent=2))


if __name__ == "__main__":
    main()
