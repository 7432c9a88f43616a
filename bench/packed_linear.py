"""Decode step time for each way the model's linears can run on this CPU, side by side.

    python bench/packed_linear.py [--model cpu-demo] [--dtype auto] [--batches 1,4,16,64] [--rounds 3]

On the CPU, F.linear in bf16 reorders each weight into oneDNN's blocked layout on every call, and in
fp32 runs MKL's general sgemm, slow at a few rows; the engine packs every weight once instead
(core_engine/model/packed_linear.py). The variants run the same engine and weights, alternating per
round, and the median decode step time of each is printed:
- plain: F.linear;
- onednn-unpadded / onednn (bf16): oneDNN's packed weight, 1-3-row GEMMs as they are, or padded to
  4 rows (packed_linear.ONEDNN_MIN_ROWS), the path where batchtop's kernels are not built;
- batchtop (bf16 on AVX512_BF16): gpu_kernels' linear_bf16, the engine's default there;
- mkl (fp32): MKL's packed sgemm.
"""

from __future__ import annotations

import argparse
import statistics

from batchtop.core_engine.perf.decode_sweep import decode_steps
from batchtop.core_engine.model import packed_linear
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.run.resolve import resolve_config

STEPS = 10


def variants(default: str | None) -> dict[str, tuple[str | None, int]]:
    """name -> (packing kind, ONEDNN_MIN_ROWS) for the kinds this CPU has."""
    out = {"plain": (None, packed_linear.ONEDNN_MIN_ROWS)}
    if default in ("batchtop", "onednn"):
        out.update({"onednn-unpadded": ("onednn", 1), "onednn": ("onednn", packed_linear.ONEDNN_MIN_ROWS)})
    if default not in (None, "onednn"):
        out[default] = (default, packed_linear.ONEDNN_MIN_ROWS)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="auto")
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    config = resolve_config(model=args.model, dtype=args.dtype, max_num_seqs=64, max_num_batched_tokens=8192, num_kv_blocks=1024)
    runner = Engine(config).runner
    param = next(runner.model.parameters())
    packing, min_rows = packed_linear.packing, packed_linear.ONEDNN_MIN_ROWS
    default = packing(param.device, param.dtype)
    kinds = variants(default)
    print(f"model {config.model.name} ({config.dtype}, {config.device}); engine's packing: {default}")
    print("batch  " + "  ".join(f"{name:>15}" for name in kinds) + "   (ms per decode step; speed-up vs plain)")
    for batch in [int(b) for b in args.batches.split(",")]:
        times: dict[str, list[float]] = {name: [] for name in kinds}
        for _ in range(args.rounds):
            for name, (kind, rows) in kinds.items():
                packed_linear.packing, packed_linear.ONEDNN_MIN_ROWS = (lambda *_, k=kind: k), rows
                snaps = decode_steps(Engine(config, runner=runner), batch, args.context, STEPS)
                times[name] += [s.step_time_s for s in snaps]
        packed_linear.packing, packed_linear.ONEDNN_MIN_ROWS = packing, min_rows
        ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
        print(f"{batch:5d}  " + "  ".join(f"{v:7.1f} ({ms['plain'] / v:4.2f}x)" for v in ms.values()), flush=True)


if __name__ == "__main__":
    main()
