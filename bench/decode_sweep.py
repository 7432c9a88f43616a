"""Decode step time vs batch size: where batching stops being free on this device.

    python bench/decode_sweep.py [--model cpu-demo] [--batches 1,2,4,8,16,32,64] [--context 128]

For each batch size B, B sequences with the same context length decode together; the median step
time of a dozen steps is printed with tokens/s and the cost of the batch relative to batch 1. While
decode is memory-bound (weights read once per step, shared by every row), step time barely moves;
past the compute ridge it grows with B. The last lines print the engine's own per-step overhead
(scheduling + input building, and everything outside the forward) at the largest batch.
"""

from __future__ import annotations

import argparse
import statistics

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.model.weight_bytes import weights_text
from batchtop.core_engine.run.resolve import resolve_config
from batchtop.core_engine.perf.decode_sweep import decode_steps

STEPS = 12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="auto")
    ap.add_argument("--batches", default="1,2,4,8,16,24,32,48,64")
    ap.add_argument("--context", type=int, default=128, help="tokens of context per sequence")
    ap.add_argument("--weights", default="auto", choices=("auto", "quantized", "dequantized"),
                    help="a GGUF model's weights (batchtop --weights)")
    ap.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float16", "float32"),
                    help="activations and KV cache (batchtop --dtype)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    config = resolve_config(model=args.model, weights=args.weights, dtype=args.dtype, max_num_seqs=max(batches),
                            max_num_batched_tokens=max(batches) * args.context, num_kv_blocks=8192)
    runner = None
    weights = weights_text(config.model, config.dtype)
    print(f"model {config.model.name} ({config.model.num_params() / 1e6:.0f}M params, {weights}) on {config.device}; "
          f"context {args.context} tokens")
    print(f"{'batch':>5} {'step ms':>8} {'tok/s':>8} {'x batch-1 time':>15} {'overhead %':>11}")
    base = None
    last = []
    for b in batches:
        engine = Engine(config, runner=runner)
        runner = engine.runner
        last = decode_steps(engine, b, args.context, STEPS)
        step = statistics.median(s.step_time_s for s in last)
        base = base or step
        overhead = statistics.median((s.schedule_s + s.prepare_s) / s.step_time_s for s in last)
        print(f"{b:5d} {1e3 * step:8.1f} {b / step:8.0f} {step / base:15.2f} {100 * overhead:10.1f}%", flush=True)
    sched_prep = sum(s.schedule_s + s.prepare_s for s in last) / sum(s.step_time_s for s in last)
    outside = sum(s.step_time_s - s.forward_s for s in last) / sum(s.step_time_s for s in last)
    print(f"engine overhead at batch {batches[-1]}: schedule + input building {100 * sched_prep:.1f}% of step time; "
          f"everything outside the forward (incl. postprocess, snapshot) {100 * outside:.1f}%  (target < 10%)")


if __name__ == "__main__":
    main()
