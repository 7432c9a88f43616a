"""TensorRT-LLM's `trtllm-serve`: its /metrics answers JSON, a list of iteration stats under the names
of cpp/tensorrt_llm/executor/jsonSerialization.cpp (numActiveRequests, numQueuedRequests,
maxNumActiveRequests, maxNumTokensRuntime, numCompletedRequests, kvCacheStats{maxNumBlocks,
usedNumBlocks, tokensPerBlock}, inflightBatchingStats{numGenRequests, numPausedRequests, numCtxTokens,
avgNumDecodedTokensPerIter}), one per engine iteration since the previous call: each call drains them.

So the gauges come from the newest iteration, and the counters attach needs (prompt and generated
tokens, steps, finished requests, a histogram of tokens per step) are summed here, per replica, over
every iteration it was handed since attach began watching. An empty list means no iteration ran since
the last scrape: the engine is idle (or runs without enable_iter_perf_stats, which the note says).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from batchtop.core_engine.attach.scrape.histogram import Histogram
from batchtop.core_engine.attach.scrape.sample import BadExposition, ReplicaSample
from batchtop.core_engine.attach.servers.trtllm import TRTLLM

STEP_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
                math.inf)  # vLLM's iteration_tokens buckets, so steps of either read alike
IDLE_NOTE = "no iteration since the last scrape (idle, or trtllm-serve runs without enable_iter_perf_stats)"
FIELDS = ("numActiveRequests", "numQueuedRequests", "numCompletedRequests", "maxNumActiveRequests",
          "maxNumTokensRuntime", "kvCacheStats.maxNumBlocks", "kvCacheStats.usedNumBlocks",
          "kvCacheStats.tokensPerBlock", "inflightBatchingStats.numGenRequests",
          "inflightBatchingStats.numPausedRequests", "inflightBatchingStats.numCtxTokens",
          "inflightBatchingStats.avgNumDecodedTokensPerIter")


def looks_like_json(body: str) -> bool:
    return body.lstrip()[:1] in ("[", "{")


def _number(entry: dict, path: str, index: int) -> float | None:
    """entry's field at a dotted path; None when absent or null; BadExposition when no server says it."""
    value: object = entry
    for part in path.split("."):
        if not isinstance(value, dict) or value.get(part) is None:
            return None
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise BadExposition(f"iteration stats [{index}].{path} = {value!r}: not a count")
    return float(value)


def _entries(body: str) -> list[dict]:
    try:
        data = json.loads(body)
    except ValueError:
        raise BadExposition("JSON that does not parse (not TensorRT-LLM's iteration stats)") from None
    entries = [data] if isinstance(data, dict) else data
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise BadExposition("JSON, but not TensorRT-LLM's iteration stats (a list of objects)")
    if entries and not any("numActiveRequests" in e for e in entries):
        raise BadExposition("JSON, but not TensorRT-LLM's iteration stats (no numActiveRequests)")
    return entries


@dataclass
class TrtllmCounters:
    """One replica's iterations summed since attach began (a Scraper keeps one)."""

    iterations: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    completed: float = 0.0
    step_counts: list[float] = field(default_factory=lambda: [0.0] * len(STEP_BUCKETS))
    step_sum: float = 0.0
    ceiling: int | None = None
    budget: int | None = None

    def _count(self, entry: dict, index: int) -> None:
        num = lambda path: _number(entry, path, index)  # noqa: E731
        ctx = num("inflightBatchingStats.numCtxTokens") or 0.0
        gen_requests = num("inflightBatchingStats.numGenRequests") or 0.0
        gen = gen_requests * max(1.0, num("inflightBatchingStats.avgNumDecodedTokensPerIter") or 0.0)
        self.iterations += 1
        self.prompt_tokens += ctx
        self.generation_tokens += gen
        self.completed += num("numCompletedRequests") or 0.0
        self.step_sum += ctx + gen
        self.step_counts[next(i for i, b in enumerate(STEP_BUCKETS) if ctx + gen <= b)] += 1
        if (ceiling := num("maxNumActiveRequests")) is not None and ceiling >= 1:
            self.ceiling = int(ceiling)
        if (budget := num("maxNumTokensRuntime")) is not None and budget >= 1:
            self.budget = int(budget)

    def steps(self) -> Histogram:
        cumulative, total = [], 0.0
        for c in self.step_counts:
            total += c
            cumulative.append(total)
        return Histogram(STEP_BUCKETS, tuple(cumulative), self.step_sum, total)

    def sample(self, body: str, t: float) -> ReplicaSample:
        """The newest iteration's gauges and every iteration's counts; BadExposition names a bad field."""
        entries = _entries(body)
        for i, entry in enumerate(entries):
            for path in FIELDS:
                _number(entry, path, i)  # every field checked before anything is counted
        for i, entry in enumerate(entries):
            self._count(entry, i)
        counters = {"prompt_tokens": self.prompt_tokens, "generation_tokens": self.generation_tokens,
                    "steps": self.iterations}
        common = dict(t=t, flavour=TRTLLM, counters=counters, success={"completed": self.completed},
                      histograms={"iteration_tokens": self.steps()}, max_num_seqs=self.ceiling,
                      ceiling_from="maxNumActiveRequests" if self.ceiling else None, token_budget=self.budget)
        if not entries:
            return ReplicaSample(**common, running=0.0, waiting=0.0, note=IDLE_NOTE)
        last = max(entries, key=lambda e: e.get("iter") if isinstance(e.get("iter"), (int, float)) else -1)
        i = entries.index(last)
        num = lambda path: _number(last, path, i)  # noqa: E731
        queued, paused = num("numQueuedRequests") or 0.0, num("inflightBatchingStats.numPausedRequests") or 0.0
        blocks, used = num("kvCacheStats.maxNumBlocks"), num("kvCacheStats.usedNumBlocks")
        if blocks is not None and used is not None and used > blocks:
            raise BadExposition(f"iteration stats [{i}].kvCacheStats: {used:g} blocks used of {blocks:g}")
        per_block = num("kvCacheStats.tokensPerBlock")
        return ReplicaSample(
            **common, running=num("numActiveRequests"), waiting=queued + paused,
            waiting_by_reason={"queued": queued, "paused": paused},
            kv_usage=used / blocks if blocks and used is not None else None,
            num_gpu_blocks=int(blocks) if blocks else None, block_size=int(per_block) if per_block else None)
