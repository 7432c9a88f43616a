"""Scripted vLLM servers for the verdict tests: expositions written by prometheus_client under vLLM
0.32's names and buckets, one per tick of a scripted load (gauges set, counters and histograms grown
as a server's would), fed to a Monitor directly or served on 127.0.0.1 one per scrape."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from batchtop.core_engine.attach.monitor import AttachFrame, Monitor
from batchtop.core_engine.attach.scrape.sample import parse_exposition
from batchtop.core_engine.serve.exporter import ITERATION_TOKEN_BUCKETS, request_token_buckets
from tests.support.attach_helpers import live
from tests.support.local_http import Answering, local_server


@dataclass(frozen=True)
class Tick:
    running: int
    waiting: int
    kv: float = 0.1
    deferred: int = 0
    steps: tuple[int, ...] = ()  # tokens of each engine step in this tick
    finished: tuple[tuple[int, int], ...] = ()  # (prompt, output) tokens of each request that finished
    preemptions: int = 0


class ScriptedVllm:
    def __init__(self, max_model_len: int = 2048) -> None:
        self.registry = r = CollectorRegistry()
        names, ids = ["model_name", "engine"], ("scripted", "0")

        def gauge(name: str, extra: list[str] = ()):
            return Gauge(name, name, names + list(extra), registry=r)

        self.running = gauge("vllm:num_requests_running").labels(*ids)
        self.waiting = gauge("vllm:num_requests_waiting").labels(*ids)
        reasons = gauge("vllm:num_requests_waiting_by_reason", ["reason"])
        self.capacity, self.deferred = reasons.labels(*ids, "capacity"), reasons.labels(*ids, "deferred")
        self.kv = gauge("vllm:kv_cache_usage_perc").labels(*ids)
        self.prompt = Counter("vllm:prompt_tokens", "prompt", names, registry=r).labels(*ids)
        self.generated = Counter("vllm:generation_tokens", "gen", names, registry=r).labels(*ids)
        self.preempted = Counter("vllm:num_preemptions", "preempted", names, registry=r).labels(*ids)
        self.success = Counter("vllm:request_success", "finished", names + ["finished_reason"],
                               registry=r).labels(*ids, "length")
        self.steps = Histogram("vllm:iteration_tokens_total", "steps", names, buckets=ITERATION_TOKEN_BUCKETS,
                               registry=r).labels(*ids)
        lengths = request_token_buckets(max_model_len)
        self.prompt_len = Histogram("vllm:request_prompt_tokens", "p", names, buckets=lengths, registry=r).labels(*ids)
        self.output_len = Histogram("vllm:request_generation_tokens", "g", names, buckets=lengths,
                                    registry=r).labels(*ids)

    def text(self, tick: Tick) -> str:
        self.running.set(tick.running)
        self.waiting.set(tick.waiting)
        self.capacity.set(tick.waiting - tick.deferred)
        self.deferred.set(tick.deferred)
        self.kv.set(tick.kv)
        for tokens in tick.steps:
            self.steps.observe(tokens)
            decode = min(tokens, tick.running)
            self.generated.inc(decode)
            self.prompt.inc(tokens - decode)
        for prompt, output in tick.finished:
            self.success.inc()
            self.prompt_len.observe(prompt)
            self.output_len.observe(output)
        self.preempted.inc(tick.preemptions)
        return generate_latest(self.registry).decode()


def feed(ticks: list[Tick], *, max_num_seqs: int | None = None, interval: float = 1.0) -> list[AttachFrame]:
    """Every tick's exposition through the parser into a Monitor, one scrape per `interval` seconds."""
    server, monitor = ScriptedVllm(), Monitor(["http://scripted:8000/metrics"], max_num_seqs=max_num_seqs)
    return [monitor.feed([live(parse_exposition(server.text(tick), i * interval))], i * interval)
            for i, tick in enumerate(ticks)]


@contextmanager
def scripted_server(ticks: list[Tick]) -> Iterator[str]:
    """A /metrics on 127.0.0.1 that answers the next tick's exposition at each scrape (the last one
    for good once the script runs out)."""
    server_state, texts = ScriptedVllm(), []
    lock = threading.Lock()

    class Handler(Answering):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            with lock:
                if len(texts) < len(ticks):
                    texts.append(server_state.text(ticks[len(texts)]))
                body = (texts[-1] if texts else server_state.text(ticks[0])).encode()
            self.answer(200, body)

    with local_server(Handler) as url:
        yield url
