"""One streaming HTTP client for two servers: batchtop's /v1/completions and llama.cpp's own /completion.

Both take the prompt as token ids (the same ids for both: no tokenizer or chat template of either
server in between) and stream one server-sent event per generated token with its id; the engines
differ only in the body's field names and where a chunk keeps its ids (Engine). Everything timed is
timed here, by the client, the same way for both.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx


@dataclass(frozen=True)
class Engine:
    name: str
    url: str

    def path(self) -> str:
        raise NotImplementedError

    def body(self, prompt: list[int], max_tokens: int, ignore_eos: bool) -> dict:
        raise NotImplementedError

    def tokens(self, chunk: dict) -> list[int]:
        """The generated ids one streamed chunk carries."""
        raise NotImplementedError


class BatchtopEngine(Engine):
    def path(self) -> str:
        return "/v1/completions"

    def body(self, prompt: list[int], max_tokens: int, ignore_eos: bool) -> dict:
        return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": ignore_eos,
                "stream": True}

    def tokens(self, chunk: dict) -> list[int]:
        return [t for choice in chunk.get("choices", ()) for t in choice.get("token_ids", ())]


class LlamaCppEngine(Engine):
    def path(self) -> str:
        return "/completion"

    def body(self, prompt: list[int], max_tokens: int, ignore_eos: bool) -> dict:
        # temperature 0 is greedy there; its prompt cache per slot stays on (its default, as batchtop's
        # prefix caching does)
        return {"prompt": prompt, "n_predict": max_tokens, "temperature": 0, "ignore_eos": ignore_eos,
                "stream": True, "return_tokens": True}

    def tokens(self, chunk: dict) -> list[int]:
        return list(chunk.get("tokens", ()))


@dataclass
class Answer:
    sent: float
    tokens: list[int] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # one per token: when the chunk carrying it arrived

    @property
    def ttft_s(self) -> float | None:
        return self.arrivals[0] - self.sent if self.arrivals else None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first."""
        if len(self.arrivals) < 2:
            return None
        return (self.arrivals[-1] - self.arrivals[0]) / (len(self.arrivals) - 1)


@dataclass
class Pass:
    """One run of a list of prompts through one engine."""

    wall_s: float
    answers: list[Answer]

    @property
    def generated(self) -> int:
        return sum(len(a.tokens) for a in self.answers)


async def stream_one(http: httpx.AsyncClient, engine: Engine, prompt: list[int], max_tokens: int,
                     ignore_eos: bool) -> Answer:
    answer = Answer(time.perf_counter())
    async with http.stream("POST", engine.url + engine.path(), json=engine.body(prompt, max_tokens, ignore_eos)) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{engine.name} answered {r.status_code}: {(await r.aread()).decode()[:500]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            ids = engine.tokens(json.loads(line[len("data: "):]))
            now = time.perf_counter()
            answer.tokens += ids
            answer.arrivals += [now] * len(ids)
    return answer


async def _run(engine: Engine, prompts: list[list[int]], max_tokens: int, ignore_eos: bool, batch: int) -> Pass:
    gate = asyncio.Semaphore(batch)
    # A fresh connection per request, for both: a kept-alive one reused against llama.cpp's HTTP server
    # (cpp-httplib) failed a request here once ("Server disconnected without sending a response")
    limits = httpx.Limits(max_connections=batch + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=900, limits=limits) as http:
        async def one(prompt: list[int]) -> Answer:
            async with gate:
                return await stream_one(http, engine, prompt, max_tokens, ignore_eos)

        t0 = time.perf_counter()
        answers = await asyncio.gather(*(one(p) for p in prompts))
        return Pass(time.perf_counter() - t0, list(answers))


def run_pass(engine: Engine, prompts: list[list[int]], max_tokens: int, *, ignore_eos: bool = True,
             batch: int | None = None) -> Pass:
    """Every prompt through the engine, at most `batch` in flight (None: all at once; 1: one at a time)."""
    return asyncio.run(_run(engine, prompts, max_tokens, ignore_eos, batch or len(prompts)))
