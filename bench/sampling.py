"""What non-greedy sampling costs over greedy: decode steps at one batch size, side by side.

    python bench/sampling.py [--model cpu-demo] [--batch 64] [--context 128] [--rounds 3]

B same-length sequences decode together, either all greedy or all with temperature 1.0 and top-p
0.9 (each its own seed); rounds alternate the two and the median step time of each is compared
(target: sampled < 1.05x greedy). It also times the sampler alone on one step's logits, and the
per-row Python loop with a full-vocabulary sort that it replaced, for scale.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request, SamplingParams
from batchtop.core_engine.run.resolve import resolve_config

STEPS = 10
SAMPLED = SamplingParams(temperature=1.0, top_p=0.9)


def step_times(engine: Engine, batch: int, context: int, sampling: SamplingParams) -> list[float]:
    engine.load_workload([Request(f"s{i}", tuple(range(1, context + 1)), STEPS + 3,
                                  sampling=SamplingParams(sampling.temperature, sampling.top_p, seed=i))
                          for i in range(batch)])
    times = []
    while not engine.is_done():
        snap = engine.step()
        if snap.is_step and snap.num_prefill_tokens == 0 and snap.num_seqs == batch:
            times.append(snap.step_time_s)
    return times[1:STEPS + 1]


def per_row_sort(logits: torch.Tensor, top_p: float, gen: torch.Generator) -> list[int]:
    """The sampler before this bench: one softmax, sort and multinomial per row."""
    out = []
    for row in logits.float():
        probs = torch.softmax(row, dim=-1)
        ordered, order = probs.sort(descending=True)
        keep = ordered.cumsum(-1) - ordered < top_p
        probs = torch.zeros_like(probs).scatter_(0, order[keep], ordered[keep])
        out.append(int(torch.multinomial(probs, 1, generator=gen)))
    return out


def median_ms(fn, repeats: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cpu-demo")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    config = resolve_config(model=args.model, max_num_seqs=args.batch,
                            max_num_batched_tokens=args.batch * args.context, num_kv_blocks=2048)
    runner = Engine(config).runner
    print(f"model {config.model.name} ({config.dtype}) on {config.device}, batch {args.batch}")
    times: dict[str, list[float]] = {"greedy": [], "sampled": []}
    for _ in range(args.rounds):
        for name, sampling in (("greedy", SamplingParams()), ("sampled", SAMPLED)):
            times[name] += step_times(Engine(config, runner=runner), args.batch, args.context, sampling)
    greedy, sampled = (statistics.median(times[k]) for k in ("greedy", "sampled"))
    print(f"decode step: greedy {1e3 * greedy:.1f} ms, temperature 1.0 + top-p 0.9 {1e3 * sampled:.1f} ms "
          f"= {sampled / greedy:.3f}x greedy (target < 1.05x)")

    logits = torch.randn(args.batch, config.model.vocab_size).to(runner.model.lm_head.weight.dtype)
    seqs_engine = Engine(config, runner=runner)
    seqs_engine.load_workload([Request(f"l{i}", (1, 2), 2, sampling=SamplingParams(1.0, 0.9, seed=i))
                               for i in range(args.batch)])
    seqs = list(seqs_engine.scheduler.waiting)
    sampler = runner.sampler
    batch = sampler.batch_for(seqs, logits.device)
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        print(f"sampler alone on ({args.batch}, {config.model.vocab_size}) logits: "
              f"torch's argmax {median_ms(lambda: logits.argmax(-1)):.2f} ms, "
              f"greedy {median_ms(lambda: sampler.sample(logits, [])):.2f} ms, "
              f"temperature + top-p {median_ms(lambda: sampler.sample(logits, seqs, batch)):.2f} ms, "
              f"the per-row sort it replaced {median_ms(lambda: per_row_sort(logits, 0.9, gen), 3):.1f} ms")


if __name__ == "__main__":
    main()
