"""Measured continuous/static throughput ratio vs the ideal ratio predicted by counting steps.

    python bench/compare.py [--num-requests 256] [--max-num-seqs 16] [--model cpu-demo]

Runs one skewed workload (lognormal output lengths, short prompts, all arriving at once) through the
real engine under static and then continuous batching, with the same weights, and compares the
measured throughput ratio with the ratio of step counts from the teaching text's loop
(bench/ideal_steps.py). The target: measured >= 85% of ideal.
"""

from __future__ import annotations

import argparse

from ideal_steps import continuous_steps, static_steps  # bench/ is on sys.path when run as a script

from core_engine.engine import Engine
from core_engine.headless import run_workload
from core_engine.setup import resolve_config
from core_engine.workload import WorkloadSpec, load_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--model", default="auto")
    ap.add_argument("--prompt-mean", type=float, default=16)
    ap.add_argument("--output-mean", type=float, default=96)
    ap.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of the lengths")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    config = resolve_config(model=args.model, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=512,
                            num_kv_blocks=4096, seed=args.seed)
    spec = WorkloadSpec(path="synthetic", num_requests=args.num_requests, prompt_mean=args.prompt_mean,
                        output_mean=args.output_mean, length_sigma=args.sigma, seed=args.seed)
    requests = load_workload(spec, config.model.vocab_size)
    lengths = [r.max_tokens for r in requests]
    ideal_static, _ = static_steps(lengths, args.max_num_seqs)
    ideal_cont, _ = continuous_steps(lengths, args.max_num_seqs)

    print(f"model {config.model.name} ({config.dtype}, {config.device}), {len(requests)} requests, "
          f"max_num_seqs {args.max_num_seqs}, output tokens {sum(lengths)} "
          f"(mean {sum(lengths) / len(lengths):.0f}, max {max(lengths)})", flush=True)
    runner = None
    measured = {}
    for mode in ("static", "continuous"):
        engine = Engine(config.with_(mode=mode), runner=runner)
        runner = engine.runner
        result = run_workload(engine, requests)
        if not result.complete:
            raise SystemExit(f"{mode} run failed: {result.error}")
        m = result.collector.summary(config.as_dict())
        measured[mode] = m
        print(f"  {mode:>10}: {m['steps']:6d} steps  {m['wall_time_s']:7.1f} s  {m['throughput_tok_s']:7.1f} tok/s  "
              f"slot utilisation {100 * m['slot_utilization']:.0f}%", flush=True)

    ideal = ideal_static / ideal_cont
    ratio = measured["continuous"]["throughput_tok_s"] / measured["static"]["throughput_tok_s"]
    step_ratio = measured["static"]["steps"] / measured["continuous"]["steps"]
    print(f"ideal (step count) ratio      {ideal:.3f}   ({ideal_static} static / {ideal_cont} continuous steps)")
    print(f"measured engine step ratio    {step_ratio:.3f}")
    print(f"measured throughput ratio     {ratio:.3f}   = {100 * ratio / ideal:.1f}% of ideal (target >= 85%)")


if __name__ == "__main__":
    main()
