"""Decode step time with the model's linears pre-packed (oneDNN for bf16, MKL for fp32) vs plain
F.linear, side by side.

    python bench/packed_linear.py [--model cpu-demo] [--dtype auto] [--batches 1,4,16,64] [--rounds 3]

On the CPU, F.linear in bf16 reorders each weight into oneDNN's blocked layout on every call, and in
fp32 runs MKL's general sgemm, slow at a few rows; the engine packs every weight once instead
(core_engine/model/packed_linear.py). Both variants run the same engine and weights, alternating per
round, and the median decode step time of each is printed. A third variant packs but leaves 1-3 row
GEMMs unpadded (packed_linear.ONEDNN_MIN_ROWS = 1), to show what the padding to 4 rows buys.
"""

from __future__ import annotations

import argparse
import statistics

from batchtop.core_engine.measure.decode_sweep import decode_steps
from batchtop.core_engine.model import packed_linear
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.resolve import resolve_config

STEPS = 10


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
    packed = packed_linear.packing
    min_rows = packed_linear.ONEDNN_MIN_ROWS
    variants = {"plain": (lambda *_: None, min_rows), "unpadded": (packed, 1), "packed": (packed, min_rows)}
    print(f"model {config.model.name} ({config.dtype}, {config.device}); packing: "
          f"{packed(next(runner.model.parameters()).device, next(runner.model.parameters()).dtype)}")
    print("batch  plain ms  packed, unpadded ms  packed ms  speed-up vs plain")
    for batch in [int(b) for b in args.batches.split(",")]:
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, (check, rows) in variants.items():
                packed_linear.packing, packed_linear.ONEDNN_MIN_ROWS = check, rows
                snaps = decode_steps(Engine(config, runner=runner), batch, args.context, STEPS)
                times[name] += [s.step_time_s for s in snaps]
        packed_linear.packing, packed_linear.ONEDNN_MIN_ROWS = packed, min_rows
        plain, unpadded, fast = (1e3 * statistics.median(times[n]) for n in ("plain", "unpadded", "packed"))
        print(f"{batch:5d}  {plain:8.1f}  {unpadded:19.1f}  {fast:9.1f}  {plain / fast:7.2f}x", flush=True)


if __name__ == "__main__":
    main()
