"""Decode step time with the model's linears pre-packed for oneDNN vs plain F.linear, side by side.

    python bench/packed_linear.py [--model cpu-demo] [--batches 1,4,16,64] [--rounds 3]

On the CPU in bf16, F.linear reorders each weight into oneDNN's blocked layout on every call; the
engine packs every weight once instead (core_engine/packed_linear.py). Both variants run the same
engine and weights, alternating per round, and the median decode step time of each is printed.
"""

from __future__ import annotations

import argparse
import statistics

from decode_steps import decode_steps  # bench/ is on sys.path when run as a script

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
    args = ap.parse_args()
    config = resolve_config(model=args.model, max_num_seqs=64, max_num_batched_tokens=8192, num_kv_blocks=1024)
    runner = Engine(config).runner
    packed = packed_linear.can_pack
    variants = {"plain": lambda *_: False, "packed": packed}
    print(f"model {config.model.name} ({config.dtype}, {config.device}); packing available: "
          f"{packed(next(runner.model.parameters()).device, next(runner.model.parameters()).dtype)}")
    print("batch  plain ms  packed ms  speed-up")
    for batch in [int(b) for b in args.batches.split(",")]:
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, check in variants.items():
                packed_linear.can_pack = check
                snaps = decode_steps(Engine(config, runner=runner), batch, args.context, STEPS)
                times[name] += [s.step_time_s for s in snaps]
        packed_linear.can_pack = packed
        plain, fast = (1e3 * statistics.median(times[n]) for n in ("plain", "packed"))
        print(f"{batch:5d}  {plain:8.1f}  {fast:9.1f}  {plain / fast:7.2f}x", flush=True)


if __name__ == "__main__":
    main()
