"""Where a throughput pass's time goes, by kind of step: torch.profiler over peer_vllm.py's throughput
workload on batchtop alone.

    python bench/profile_throughput.py --checkpoint DIR [--num-requests 64] [--slots 16]

The workload is peer_vllm.py --mode throughput's (all requests at once, lognormal prompts ~64 and
outputs ~128, EOS ignored, greedy), run once untimed and once under the profiler. Each forward is
labelled by what it carries: full decode steps (every slot decoding), the tail (1-3 decode rows, the
long requests finishing alone), other decode steps, and mixed steps (prompt chunks riding with decode
rows). For each kind: its steps, their mean profiled time, and the ops' self time per step, largest
first. On the KV pool such a run leaves behind (blocks in no order, far more than the caches hold),
not the fresh one bench/profile_decode.py decodes over.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import torch

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.model import llama
from batchtop.core_engine.model.hf_config import read_model_config
from batchtop.core_engine.run.headless import run_workload
from peer_hf import timed_run
from peer_vllm import BatchtopPeer
from peer_vllm_throughput import throughput_workload

LABEL = "step: "


def kind(tokens: int, decode_rows: int, slots: int) -> str:
    if tokens > decode_rows:
        return "mixed (prompt chunks + decode rows)"
    if decode_rows == slots:
        return f"full decode ({slots} rows)"
    return "tail decode (1-3 rows)" if decode_rows < 4 else "other decode"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, required=True, help="a model directory (batchtop export-checkpoint)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--prompt-mean", type=float, default=64.0)
    ap.add_argument("--output-mean", type=float, default=128.0)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--max-batched-tokens", type=int, default=256)
    ap.add_argument("--num-kv-blocks", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top", type=int, default=8, help="ops listed per kind of step")
    args = ap.parse_args()
    args.max_num_seqs = args.slots
    peer = BatchtopPeer(args.checkpoint, args.dtype, args)
    requests = throughput_workload(args, read_model_config(args.checkpoint).vocab_size)
    timed_run(peer.engine, requests)  # warm-up: allocators, packs, the pool's pages

    steps: collections.Counter = collections.Counter()
    forward = llama.LlamaForCausalLM.forward

    def labelled(self, input_ids, positions, batch, logits_rows):
        label = kind(input_ids.numel(), batch.num_decode_rows, args.slots)
        steps[label] += 1
        with torch.profiler.record_function(LABEL + label):
            return forward(self, input_ids, positions, batch, logits_rows)

    llama.LlamaForCausalLM.forward = labelled
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            run_workload(Engine(peer.engine.config, runner=peer.engine.runner), requests)
    finally:
        llama.LlamaForCausalLM.forward = forward

    total: collections.Counter = collections.Counter()
    ops: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for event in prof.events():
        step = event
        while step is not None and not step.name.startswith(LABEL):
            step = step.cpu_parent
        if step is None:
            continue
        label = step.name[len(LABEL):]
        if event is step:
            total[label] += event.cpu_time_total
        else:
            ops[label][event.name] += event.self_cpu_time_total
    print(f"{args.checkpoint.name}, {args.dtype}, {torch.get_num_threads()} threads, {len(requests)} requests, "
          f"{args.slots} slots")
    for label, n in steps.most_common():
        print(f"== {label}: {n} steps, {total[label] / n / 1e3:.1f} ms a step (profiled), "
              f"{total[label] / 1e6:.2f} s in all")
        for name, us in ops[label].most_common(args.top):
            print(f"   {name:40s} {us / n / 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
