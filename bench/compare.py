"""Measured continuous/static throughput ratio vs the ideal ratio predicted by counting steps.

    python bench/compare.py [--num-requests 256] [--max-num-seqs 8,16] [--model cpu-demo]

Runs one skewed workload (lognormal output lengths, short prompts, all arriving at once) through two
real engines with the same weights, one static and one continuous, and compares the measured
throughput ratio with the ratio of step counts from the teaching text's loop (bench/ideal_steps.py).
The target: measured >= 85% of ideal.

The step-count model assumes a step costs the same whatever its batch, which holds while decode is
memory-bound. On a 2-core CPU the ridge is ~12 FLOP/B, so a batch of 16 is already past it and a
continuous step (16 live rows) costs more than a static step with few live rows: the default runs 8
slots (left of the ridge) and 16 (past it) to show both. On a GPU the ridge is in the hundreds.

The two engines take turns, one step each, so both see the same machine: a noisy neighbour that
slows one stretch of the run slows both modes alike instead of skewing the ratio. Throughput is
generated tokens over each engine's own busy time (the sum of its step times).
"""

from __future__ import annotations

import argparse

from ideal_steps import continuous_steps, static_steps  # bench/ is on sys.path when run as a script

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.perf.metrics import MetricsCollector
from batchtop.core_engine.run.resolve import resolve_config
from batchtop.core_engine.workload.spec import WorkloadSpec, load_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--max-num-seqs", default="8,16", help="one run per value, comma-separated")
    ap.add_argument("--model", default="auto")
    ap.add_argument("--prompt-mean", type=float, default=16)
    ap.add_argument("--output-mean", type=float, default=96)
    ap.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of the lengths")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for max_num_seqs in (int(n) for n in args.max_num_seqs.split(",")):
        config = resolve_config(model=args.model, max_num_seqs=max_num_seqs, max_num_batched_tokens=512,
                                num_kv_blocks=4096, seed=args.seed)
        spec = WorkloadSpec(path="synthetic", num_requests=args.num_requests, prompt_mean=args.prompt_mean,
                            output_mean=args.output_mean, length_sigma=args.sigma, seed=args.seed)
        compare(config, load_workload(spec, config.model.vocab_size))


def compare(config, requests) -> None:
    """Both modes over the same requests, interleaved step by step; prints the ratios."""
    lengths = [r.max_tokens for r in requests]
    ideal_static, _ = static_steps(lengths, config.max_num_seqs)
    ideal_cont, _ = continuous_steps(lengths, config.max_num_seqs)
    print(f"model {config.model.name} ({config.dtype}, {config.device}), {len(requests)} requests, "
          f"max_num_seqs {config.max_num_seqs}, output tokens {sum(lengths)} "
          f"(mean {sum(lengths) / len(lengths):.0f}, max {max(lengths)})", flush=True)
    engines = {mode: Engine(config.with_(mode=mode)) for mode in ("static", "continuous")}  # same seed
    collectors = {mode: MetricsCollector() for mode in engines}
    busy = dict.fromkeys(engines, 0.0)
    for engine in engines.values():
        engine.load_workload(requests)
    while not all(engine.is_done() for engine in engines.values()):
        for mode, engine in engines.items():
            if not engine.is_done():
                snap = engine.step()
                collectors[mode].observe(snap)
                busy[mode] += snap.step_time_s
    measured = {}
    for mode, engine in engines.items():
        c = engine.counters
        if c.completed != len(requests):
            raise SystemExit(f"{mode}: {c.completed} of {len(requests)} requests completed")
        slots = collectors[mode].summary(config.as_dict())["slot_utilization"]
        measured[mode] = {"steps": c.steps, "throughput_tok_s": c.generated_tokens / busy[mode]}
        print(f"  {mode:>10}: {c.steps:6d} steps  {busy[mode]:7.1f} s busy  "
              f"{measured[mode]['throughput_tok_s']:7.1f} tok/s  slot utilisation {100 * slots:.0f}%", flush=True)

    ideal = ideal_static / ideal_cont
    ratio = measured["continuous"]["throughput_tok_s"] / measured["static"]["throughput_tok_s"]
    step_ratio = measured["static"]["steps"] / measured["continuous"]["steps"]
    print(f"ideal (step count) ratio      {ideal:.3f}   ({ideal_static} static / {ideal_cont} continuous steps)")
    print(f"measured engine step ratio    {step_ratio:.3f}")
    print(f"measured throughput ratio     {ratio:.3f}   = {100 * ratio / ideal:.1f}% of ideal (target >= 85%)\n",
          flush=True)


if __name__ == "__main__":
    main()
