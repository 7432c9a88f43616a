"""Shared pieces of the attach tests: the real vLLM captures, expositions written by prometheus_client
under SGLang's documented names, a local HTTP server whose /metrics misbehaves on demand, and one
that drips its answer a byte at a time."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from batchtop.core_engine.attach.scrape.sample import ReplicaSample, parse_exposition
from batchtop.core_engine.attach.scrape.scrape import LIVE, ScrapeResult
from tests.support.local_http import Answering, local_server

DATA = Path(__file__).resolve().parents[1] / "data"
VLLM_IDLE = DATA / "vllm-0.32-cpu-idle.prom"
VLLM_T0 = DATA / "vllm-0.32-cpu-load-t0.prom"
VLLM_T2 = DATA / "vllm-0.32-cpu-load-t2s.prom"


def vllm_sample(path: Path, t: float) -> ReplicaSample:
    return parse_exposition(path.read_text(encoding="utf-8"), t)


def restarted(text: str, start_time: float) -> str:
    """A capture as a restarted server would give it: a new process_start_time_seconds."""
    lines = [f"process_start_time_seconds {start_time!r}" if line.startswith("process_start_time_seconds ") else line
             for line in text.splitlines()]
    assert lines != text.splitlines(), "the capture exposes no process_start_time_seconds"
    return "\n".join(lines) + "\n"


def live(sample: ReplicaSample) -> ScrapeResult:
    return ScrapeResult(LIVE, None, sample, 0.01)


def sglang_text(running: int, queued: int, token_usage: float, prompt: int, generated: int,
                ttfts: list[float]) -> str:
    """An SGLang-style exposition (names and labels as its Production Metrics page lists them)."""
    r = CollectorRegistry()
    labels = {"model_name": "meta-llama/Llama-3.1-8B-Instruct"}
    for name, doc, value in (("sglang:num_running_reqs", "running", running),
                             ("sglang:num_queue_reqs", "queued", queued),
                             ("sglang:token_usage", "token usage", token_usage),
                             ("sglang:gen_throughput", "gen throughput", 0.0)):
        Gauge(name, doc, list(labels), registry=r).labels(**labels).set(value)
    Counter("sglang:prompt_tokens", "prefill tokens", list(labels), registry=r).labels(**labels).inc(prompt)
    Counter("sglang:generation_tokens", "generation tokens", list(labels), registry=r).labels(**labels).inc(generated)
    h = Histogram("sglang:time_to_first_token_seconds", "ttft", list(labels), registry=r,
                  buckets=(0.1, 0.2, 0.4, 0.8, 1.6, 3.2)).labels(**labels)
    for v in ttfts:
        h.observe(v)
    return generate_latest(r).decode()


class FlakyMetrics:
    """What the fake server's /metrics answers; tests change `mode` and `text` between scrapes."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.mode = "ok"  # ok | stall | error | garbage
        self.stall_s = 2.0


def flaky_server(state: FlakyMetrics) -> AbstractContextManager[str]:
    """The fake server's URL, as a context manager (tests/support/local_http.py)."""
    class Handler(Answering):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if state.mode == "stall":
                time.sleep(state.stall_s)
            if state.mode == "error":
                self.answer(500, b"internal error")
            elif state.mode == "garbage":
                self.answer(200, b"<html><body>Welcome to nginx!</body></html>")
            else:
                self.answer(200, state.text.encode())

    return local_server(Handler)


@contextmanager
def drip_server(part: str, every_s: float = 0.2) -> Iterator[str]:
    """A /metrics that never finishes: `part` "body" sends its status line and headers at once, then
    one body byte every `every_s` (each read beats any timeout, the body never ends); "headers"
    drips the headers themselves the same way."""
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)

    def drip(conn: socket.socket, data: bytes) -> None:
        for i in range(len(data)):
            if stop.wait(every_s):
                return
            conn.sendall(data[i:i + 1])

    def answer(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                if part == "headers":
                    drip(conn, b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 60000)
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n")
                    drip(conn, b"#" * 100000)
            except OSError:
                pass  # the scraper gave up and closed its end

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=2)
        listener.close()
