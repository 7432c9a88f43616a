"""One-row Q4_1 GEMVs by matrix size, the same bytes streamed at every size: what a call costs beside its bytes.

    python bench/quant_gemv_sizes.py [--threads 2] [--total-mb 96] [--rounds 3] [--library SO]

SmolLM2-135M's decode step makes 121 GEMM calls of 0.2-1.1 MB (qkv, o, gate_up, down in each of 30 layers)
and one of 30 MB (the lm_head). For each width N (K = 576, SmolLM2's hidden size) the bench makes as many
distinct matrices as stream --total-mb together (larger than the last-level cache: every call reads from
memory), calls linear_quant on each in turn, and prints the GB/s of the fastest pass. The read column is
a torch sum over 256 MiB timed after each round: the best read rate of the rounds so far
(linear_quant.ReadRate). A least-squares line through time per call against bytes per call splits the
cost into a fixed part per call (Python dispatch of the op included, about 2 us here) and the rate the
bytes stream at.
--library loads a kernel library built elsewhere (a development build) instead of batchtop's own.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from linear_quant import ReadRate, kernel_ops  # bench/

K = 576
WIDTHS = (192, 576, 1536, 3072, 12288, 49152)  # k/v, q/o, up/gate, gate_up, 4x, the lm_head's rows
Q4_1, BLOCK_BYTES = 3, 20


def random_blocks(n: int) -> torch.Tensor:
    """(n, K / 32 * 20) Q4_1 blocks with ordinary fp16 scales and mins (0x2000 = 2^-7) and random nibbles."""
    blocks = torch.randint(0, 256, (n, K // 32 * BLOCK_BYTES), dtype=torch.uint8)
    view = blocks.view(n, K // 32, BLOCK_BYTES)
    view[:, :, 0], view[:, :, 1], view[:, :, 2], view[:, :, 3] = 0, 0x20, 0, 0x20
    return blocks


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(seconds per call at zero bytes, bytes per second) of the least-squares line through (bytes, seconds)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, 1 / slope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--total-mb", type=float, default=96.0, help="bytes streamed per pass at every size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--library", type=Path, help="a built batchtop_cpu_kernels .so to load instead")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ops = kernel_ops(args.library, "quant_gemv_sizes")
    torch.manual_seed(0)
    read = ReadRate()
    x = torch.randn(1, K).to(torch.bfloat16)
    print(f"{args.threads} thread(s); Q4_1, K = {K}, {args.total_mb:.0f} MB a pass; GB/s of the best pass per size")
    sizes = "".join(f"{n * K // 32 * BLOCK_BYTES / 1e3:>7.0f} KB" for n in WIDTHS)
    print(sizes + "   read GB/s   fixed us/call   GB/s")
    for _ in range(args.rounds):
        cells, points = [], []
        for n in WIDTHS:
            per_call = n * K // 32 * BLOCK_BYTES
            count = max(2, int(args.total_mb * 1e6 // per_call))
            weights = [ops.pack_linear_quant(random_blocks(n), Q4_1) for _ in range(count)]
            out = torch.empty(1, n, dtype=torch.bfloat16)

            def one_pass() -> None:
                for w in weights:
                    ops.linear_quant(out, x, w, Q4_1, None, 0)

            one_pass()
            best = min(timed(one_pass) for _ in range(5))
            cells.append(f"{per_call * count / best / 1e9:10.1f}")
            points.append((per_call, best / count))
            del weights
        fixed_s, rate = fit(points[:-1])  # the small calls, where the fixed part shows; the 30 MB one dwarfs them
        read.round()
        print("".join(cells) + f"   {read.gbps():9.1f}   {fixed_s * 1e6:13.1f}   {rate / 1e9:4.1f}", flush=True)


if __name__ == "__main__":
    main()
