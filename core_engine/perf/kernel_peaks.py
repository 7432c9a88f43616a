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

The compute roof is the fastest GEMM kernel the engine runs for the dtype, not one kernel's figure: a
GGUF's quantized blocks run linear_quant's int8 dot products (AVX-512 VNNI), which reach 1.3x
linear_bf16's VDPBF16PS here (478 against 370 GFLOP/s on a 2-core Zen 4), so a quantized prefill held
to the bf16 GEMM's roof read above 1.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


KERNELS_SOURCE = "batchtop linear_bf16"  # in a roof's source: measured on batchtop's kernels
BF16_GEMM, QUANT_GEMM = "linear_bf16", "linear_quant Q8_0"  # the GEMM kernels a bf16 step runs
QUANT_PROBE_TYPE = "Q8_0"  # int8 blocks: the quantized kernel's fastest path (VNNI dot products)


@dataclass(frozen=True, slots=True)
class KernelPeaks:
    """Each GEMM kernel's best FLOP/s and the GEMV's bytes/s: the compute roof is the fastest of them."""

    gemm: dict[str, float]  # kernel name (BF16_GEMM, QUANT_GEMM) -> FLOP/s, best of its probes
    gemv_bytes_per_s: float

    @property
    def flops(self) -> float:
        return max(self.gemm.values())

    @property
    def fastest(self) -> str:
        return max(self.gemm, key=self.gemm.__getitem__)

    def text(self) -> str:
        """The kernels as a roof's source names them: "linear_quant Q8_0 478 GFLOP/s > linear_bf16 370"."""
        ranked = sorted(self.gemm.items(), key=lambda item: -item[1])
        return " > ".join(f"{name} {flops / 1e9:.0f}" for name, flops in ranked) + " GFLOP/s"


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


def kernel_peaks(gemm_n: int = 2048, gemm_rows: tuple[int, ...] = (16, 64), gemv_mib: int = 256) -> KernelPeaks:
    """Each GEMM kernel's FLOP/s on its best of gemm_rows x gemm_n x gemm_n (linear_bf16, and linear_quant's
    int8 blocks where this build and CPU run them), and the weight bytes/s of linear_bf16's one-row GEMV
    over a gemv_mib MiB weight."""
    from batchtop.gpu_kernels import cpu_kernels, quant_kernels
    torch.manual_seed(0)
    packed = cpu_kernels.pack_linear_bf16(torch.randn(gemm_n, gemm_n).to(torch.bfloat16))
    gemm = {BF16_GEMM: best_rows(lambda x: cpu_kernels.linear_bf16(x, packed, None, gemm_n), gemm_n, gemm_rows)}
    if quant_kernels.usable(QUANT_PROBE_TYPE):
        try:
            blocks = quant_kernels.pack(q8_0_blocks(gemm_n, gemm_n), QUANT_PROBE_TYPE)
            gemm[QUANT_GEMM] = best_rows(lambda x: quant_kernels.linear_quant(
                x, blocks, QUANT_PROBE_TYPE, None, gemm_n, packed=True), gemm_n, gemm_rows)
        except (RuntimeError, ValueError):
            pass  # a build whose int8 kernel cannot run this shape: the roof is linear_bf16's, as before
    return KernelPeaks(gemm, gemv_probe(gemv_mib)())


def best_rows(gemm: Callable[[torch.Tensor], object], n: int, rows: tuple[int, ...]) -> float:
    """FLOP/s of an n x n GEMM kernel at its best row count (each best of 7): a roof is the best seen."""
    flops = 0.0
    for m in rows:
        x = torch.randn(m, n).to(torch.bfloat16)
        flops = max(flops, 2 * m * n * n / best_time(lambda: gemm(x), 7))
    return flops


def q8_0_blocks(n: int, k: int) -> torch.Tensor:
    """An (n, k) Q8_0 block matrix as a GGUF stores it: per 32 weights an fp16 scale and 32 int8 values."""
    blocks = torch.randint(-127, 128, (n, k // 32, 34), dtype=torch.int8).view(torch.uint8)
    blocks[..., :2] = torch.tensor([1 / 64], dtype=torch.float16).view(torch.uint8)
    return blocks.reshape(n, k // 32 * 34).contiguous()


def compute_kernels(device: str, dtype: str) -> tuple[str, ...]:
    """The GEMM kernels a step runs for this dtype, whose fastest sets the compute roof (isa_peak.py)."""
    if not kernels_in_use(device, dtype):
        return (f"torch {dtype} GEMM",)
    from batchtop.gpu_kernels import quant_kernels
    return (BF16_GEMM, QUANT_GEMM) if quant_kernels.usable(QUANT_PROBE_TYPE) else (BF16_GEMM,)


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
