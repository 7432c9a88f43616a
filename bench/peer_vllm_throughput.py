"""peer_vllm.py's throughput mode: batchtop and vLLM's offline CPU engine, timed in alternating rounds.

Same checkpoint, same requests (synthetic: lognormal prompts and outputs, all arriving at once, EOS
ignored, greedy), same max_num_seqs and max_num_batched_tokens, same thread count. Each engine
first runs the workload once untimed (warm-up), then the rounds alternate the two, so background
load on a shared host hits both alike. Per slot count it prints each engine's generated tok/s
(median of the rounds), the ratio in every round, and TTFT / TPOT p50 (vLLM's from its own
per-request timestamps, batchtop's from its metrics).

    python bench/peer_vllm.py --mode throughput --vllm-python /work/vllm-venv/bin/python [--slots 8,16]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.sched.request import Request, SamplingParams
from batchtop.core_engine.model.hf_config import read_model_config
from batchtop.core_engine.workload.spec import WorkloadSpec, load_workload
from peer_hf import Timed, timed_run

MAX_MODEL_LEN = 2048  # what bench/vllm_worker.py gives vLLM


def ours_pass_with_latencies(engine: Engine, requests: list[Request],
                             peaks: DevicePeaks) -> tuple[Timed, tuple[list, list], float | None]:
    """The whole workload through a fresh engine sharing the warm model, with per-request TTFT/TPOT and
    its decode steps' mean fraction of the roof (the metrics' roofline.decode.fraction_of_roof_mean)."""
    timed, collector = timed_run(engine, requests)
    finished = collector.finished
    fraction = collector.roofline(peaks)["decode"]["fraction_of_roof_mean"]
    return timed, ([f.ttft_s for f in finished], [f.tpot_s for f in finished]), fraction


def throughput_workload(args: argparse.Namespace, vocab_size: int) -> list[Request]:
    spec = WorkloadSpec(path="synthetic", num_requests=args.num_requests, prompt_mean=args.prompt_mean,
                        output_mean=args.output_mean, seed=args.seed)
    out = []
    for r in load_workload(spec, vocab_size):
        max_tokens = max(1, min(r.max_tokens, MAX_MODEL_LEN - len(r.prompt_token_ids)))
        out.append(Request(r.id, r.prompt_token_ids, max_tokens, sampling=SamplingParams(ignore_eos=True)))
    return out


def p50(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def run_throughput_with(open_peers, alternate, checkpoint: Path, python: str, args: argparse.Namespace,
                        work: Path) -> None:
    requests = throughput_workload(args, read_model_config(checkpoint).vocab_size)
    tokens = sum(r.max_tokens for r in requests)
    dtype = args.dtypes[-1]
    print(f"{len(requests)} requests at once, prompts ~{args.prompt_mean:.0f}, outputs ~{args.output_mean:.0f} "
          f"(lognormal), {tokens} generated tokens a pass; {dtype}; {args.rounds} alternating timed rounds "
          "after one warm-up pass each")
    report = {"dtype": dtype, "threads": args.threads, "num_requests": len(requests), "tokens": tokens,
              "max_num_batched_tokens": args.max_batched_tokens, "slots": {}}
    for slots in args.slots:
        sized = argparse.Namespace(**{**vars(args), "max_num_seqs": slots})
        with open_peers(checkpoint, dtype, python, sized, work) as peers:
            alternate(peers, requests, rounds=1)  # warm-up: allocators, oneDNN primitives, vLLM's caches
            passes = alternate(peers, requests, rounds=args.rounds)
            latencies = {p.name: p.latencies for p in peers}
        for name, timed in passes.items():
            got = sum(len(v) for v in timed[-1].outputs.values())
            if got != tokens:
                raise RuntimeError(f"{name} generated {got} tokens, expected {tokens}")
        rates = {name: [tokens / t.wall_s for t in timed] for name, timed in passes.items()}
        ratios = [ours / theirs for ours, theirs in zip(rates["batchtop"], rates["vLLM"])]
        row = {name: {"tok_s_median": statistics.median(r), "tok_s": r,
                      "ttft_p50_s": p50(latencies[name][0]), "tpot_p50_s": p50(latencies[name][1])}
               for name, r in rates.items()}
        row["ratio_per_round"] = ratios
        row["ratio_median"] = statistics.median(ratios)
        fractions = next(p.roof_fractions[-args.rounds:] for p in peers if p.name == "batchtop")
        row["batchtop"]["decode_fraction_of_roof"] = fractions
        report["slots"][slots] = row
        print(f"  max_num_seqs {slots:3d}: " + "   ".join(
            f"{name} {row[name]['tok_s_median']:6.1f} tok/s (TTFT p50 {1e3 * (row[name]['ttft_p50_s'] or 0):.0f} ms, "
            f"TPOT p50 {1e3 * (row[name]['tpot_p50_s'] or 0):.1f} ms)" for name in rates))
        print(f"      batchtop / vLLM per round: {', '.join(f'{x:.2f}x' for x in ratios)}; "
              f"median {row['ratio_median']:.2f}x (target >= 1.0x, aim 1.2x)")
        print(f"      batchtop's decode steps at {', '.join(f'{x:.2f}' for x in fractions if x is not None)} of the roof "
              "per round (roofline.decode.fraction_of_roof_mean)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
