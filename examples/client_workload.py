"""What both example clients send, and how they report: the same requests, so only the sending differs.

Prompts are token ids (the random-weight presets have no tokenizer); output lengths are lognormal, like
real traffic: most answers are short, a few are long. That spread is what makes waiting for a whole
batch expensive.
"""

from __future__ import annotations

import argparse
import math
import random
import time

from openai import AsyncOpenAI


def parse_args(doc: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    ap.add_argument("--api-key", default="unused")
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--concurrency", type=int, default=16, help="batch size, or requests kept in flight")
    ap.add_argument("--output-mean", type=float, default=64.0)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


def make_requests(n: int, output_mean: float, seed: int) -> list[tuple[list[int], int]]:
    """(prompt token ids, max_tokens) pairs: prompts of 16-64 ids under 512 (any preset's vocabulary)."""
    rng = random.Random(seed)
    sigma = 1.0
    mu = math.log(output_mean) - sigma ** 2 / 2  # a lognormal with this mean
    return [([rng.randrange(512) for _ in range(rng.randint(16, 64))],
             max(1, min(512, round(rng.lognormvariate(mu, sigma))))) for _ in range(n)]


async def complete(client: AsyncOpenAI, model: str, prompt: list[int], max_tokens: int) -> int:
    out = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
    return out.usage.completion_tokens


async def connect(args: argparse.Namespace) -> tuple[AsyncOpenAI, str]:
    client = AsyncOpenAI(base_url=args.url.rstrip("/") + "/v1", api_key=args.api_key, max_retries=0)
    model = (await client.models.list()).data[0].id
    return client, model


def report(label: str, tokens: list[int], started: float) -> None:
    wall = time.perf_counter() - started
    print(f"{label}: {len(tokens)} requests, {sum(tokens)} tokens in {wall:.1f} s = {sum(tokens) / wall:.1f} tok/s")
