"""Where a decode step's time goes: torch.profiler over real engine decode steps at a few batch sizes.

    python bench/profile_decode.py [--model cpu-demo] [--batches 1,16,64] [--context 128] [--rows 12]

For each batch size, B sequences with the same context decode together; after a warm-up step the
next steps run under torch.profiler and the top ops by self CPU time are printed, grouped as
matmul / attention / sampling / elementwise / other, with each group's share of the profiled time.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request, SamplingParams
from batchtop.core_engine.run.resolve import resolve_config

GROUPS = (
    ("matmul", ("linear", "mkl", "addmm", "mm", "matmul", "_proj", "gate_up")),  # fused.*: the one-call layer's stages
    ("attention", ("scaled_dot_product", "paged_attention", "fused.attention", "index_select", "index_copy", "_flash", "bmm", "baddbmm")),
    ("sampling", ("argmax", "sample", "sort", "softmax", "multinomial", "cumsum", "topk", "exponential")),
    ("elementwise", ("mul", "add", "cat", "silu", "rms_norm", "norm", "rope", "neg", "cos", "sin", "copy_", "to")),
)


def group_of(name: str) -> str:
    for group, keys in GROUPS:
        if any(k in name for k in keys):
            return group
    return "other"


def profile_batch(engine: Engine, batch: int, context: int, steps: int, rows: int, temperature: float) -> None:
    sampling = SamplingParams(temperature=temperature, top_p=0.9 if temperature else 1.0)
    engine.load_workload([Request(f"p{batch}-{i}", tuple(range(1, context + 1)), steps + 4, sampling=sampling)
                          for i in range(batch)])
    while engine.step().num_prefill_tokens:  # prefill, then one warm-up decode step
        pass
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    groups: dict[str, float] = {}
    for e in events:
        groups[group_of(e.key)] = groups.get(group_of(e.key), 0.0) + e.self_cpu_time_total
    print(f"\n== batch {batch}: {total / steps / 1e3:.1f} ms of op time per step")
    print("   " + ", ".join(f"{g} {100 * t / total:.0f}%" for g, t in sorted(groups.items(), key=lambda kv: -kv[1])))
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:rows]:
        print(f"   {e.key[:48]:48s} {e.count // steps:5d}/step {e.self_cpu_time_total / steps / 1e3:8.2f} ms/step "
              f"{100 * e.self_cpu_time_total / total:5.1f}%")
    while not engine.is_done():
        engine.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cpu-demo")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rows", type=int, default=12)
    ap.add_argument("--temperature", type=float, default=0.0, help="> 0 profiles non-greedy sampling")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    config = resolve_config(model=args.model, max_num_seqs=max(batches),
                            max_num_batched_tokens=max(batches) * args.context, num_kv_blocks=2048)
    print(f"model {config.model.name} ({config.dtype}) on {config.device}, {torch.get_num_threads()} threads")
    runner = None
    for b in batches:
        engine = Engine(config, runner=runner)
        runner = engine.runner
        profile_batch(engine, b, args.context, args.steps, args.rows, args.temperature)


if __name__ == "__main__":
    main()
