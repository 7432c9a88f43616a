"""The CPU roofs batchtop's own bf16 kernels reach, where they run.

torch's bf16 GEMM and a tensor copy understate this CPU: batchtop's linear_bf16 (weights packed once;
AVX512_BF16, or AVX2 and FMA) runs a GEMM faster than torch's, and its GEMV streams a weight faster
than a copy moves one, so a decode step measured against torch's roofs read above 100% of them. Where
the kernels are active, device_peaks takes their GEMM's FLOP/s for the compute roof (the step's GEMMs
are theirs; torch's bf16 GEMM without AVX512_BF16 takes about a minute at 2048^3) and the higher of
the copy's and their GEMV's bandwidth for the memory roof: the best this machine was seen to do,
which a step made of those same kernels cannot beat.

The GEMV streams as many bytes as the copy (device_peaks.probe_mib: 256 MiB, about a SmolLM2 step's
weights, or 8x the last-level cache), not a quarter of them. A last-level cache can keep part of a
stream twice its size from one pass to the next: here a 64 MiB GEMV on a Zen 5 with a 32 MiB L3 read
1.2-1.7x as fast as a 256 MiB one in the same process, and a step that streams 270 MB of weights was
held to what the cache returned, not to what memory delivers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


KERNELS_SOURCE = "batchtop linear_bf16"  # in a roof's source: measured on batchtop's kernels


def kernels_in_use(device: str, dtype: str) -> bool:
    """Whether bf16 linears run on batchtop's CPU kernels now (never builds them)."""
    if device != "cpu" or dtype != "bfloat16":
        return False
    from batchtop.gpu_kernels import cpu_kernels
    return cpu_kernels.active() and bool(torch.ops.batchtop_cpu.linear_bf16_supported())


def kernels_for_roofs(device: str, dtype: str) -> bool:
    """Whether the roofs are to be measured on batchtop's kernels: the roofs of the kernels that will run.
    Where nothing builds them in the background (headless, attach, calibrate) they are loaded now, or
    built in the foreground once per machine, as any first use builds them (cpu_kernels.available).
    While the dashboard's background build runs, the torch ops run and these are False: the roofs are
    torch's until the kernels come in, and then measured again (core_engine/perf/live_roofs.py)."""
    if device != "cpu" or dtype != "bfloat16":
        return False
    from batchtop.gpu_kernels import cpu_kernels
    return cpu_kernels.available() and kernels_in_use(device, dtype)


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` runs after one warm-up: a peak is the best the device was seen to do."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def kernel_peaks(gemm_n: int = 2048, gemm_rows: tuple[int, ...] = (16, 64), gemv_mib: int = 256) -> tuple[float, float]:
    """(FLOP/s of linear_bf16 on its best of gemm_rows x gemm_n x gemm_n, weight bytes/s of its one-row
    GEMV over a gemv_mib MiB weight)."""
    from batchtop.gpu_kernels import cpu_kernels
    torch.manual_seed(0)
    weight = torch.randn(gemm_n, gemm_n).to(torch.bfloat16)
    packed = cpu_kernels.pack_linear_bf16(weight)
    flops = 0.0
    for rows in gemm_rows:
        x = torch.randn(rows, gemm_n).to(torch.bfloat16)
        seconds = best_time(lambda: cpu_kernels.linear_bf16(x, packed, None, gemm_n), 7)
        flops = max(flops, 2 * rows * gemm_n * gemm_n / seconds)
    return flops, gemv_probe(gemv_mib)()


def gemv_probe(mib: int) -> Callable[[], float]:
    """linear_bf16's one-row GEMV over a weight of about `mib` MiB, built once; each call of what this
    returns times it (best of 7) and gives the bytes/s it streamed the weight at."""
    from batchtop.gpu_kernels import cpu_kernels, huge_pages
    k = 4096
    n = max(64, mib * (1 << 20) // (2 * k) // 64 * 64)
    # one packed 64-row group repeated: the bytes a GEMV streams, without packing a 256 MiB weight
    group = cpu_kernels.pack_linear_bf16(torch.randn(64, k).to(torch.bfloat16))
    packed = huge_pages.empty((n // 64, *group.shape[1:]), group.dtype)  # where the step's packs are
    packed.copy_(group.expand_as(packed))
    x = torch.randn(1, k).to(torch.bfloat16)
    return lambda: n * k * 2 / best_time(lambda: cpu_kernels.linear_bf16(x, packed, None, n), 7)
