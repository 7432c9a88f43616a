"""Prometheus as users run it: a real Prometheus server (Debian's `prometheus` package) scrapes
`batchtop serve` every second on 127.0.0.1, and the PromQL of vLLM's own Grafana dashboard returns
what batchtop's own numbers say, within rounding:

- `rate(vllm:generation_tokens_total[1m])` (and the prompt one) x 60 = the engine's token counts;
- `histogram_quantile(0.99, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket[1m])))` = the
  p99 attach computes from the same buckets;
- `vllm:kv_cache_usage_perc`, sample by sample, = what each scrape of /metrics answered (a proxy
  between the two records every answer).

The counters start at 0 inside the 1 m range and the query runs at the last sample's time, so
Prometheus' rate() extrapolates nothing: the comparison is exact, not approximate.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from batchtop.core_engine.attach.scrape.sample import parse_exposition
from tests.conftest import tiny_config
from tests.support.local_http import Answering, local_server
from tests.support.serving import serving, wait_idle

PROMETHEUS = shutil.which("prometheus")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    PROMETHEUS is None, reason="no prometheus binary here (Debian: apt-get install -y prometheus)")]


@contextmanager
def recording_proxy(upstream: str) -> Iterator[tuple[str, list[str]]]:
    """host:port of a /metrics that answers what `upstream`'s does, keeping every answer in order."""
    bodies: list[str] = []
    lock = threading.Lock()

    class Handler(Answering):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            with lock:  # one scrape at a time: the list's order is the scrapes' order
                answer = httpx.get(upstream + "/metrics", timeout=5)
                bodies.append(answer.text)
            # Prometheus may give up on a scrape (its timeout on a busy host): it keeps no sample
            self.answer(answer.status_code, answer.content, answer.headers.get("content-type", "text/plain"))

    with local_server(Handler) as url:
        yield url.removeprefix("http://"), bodies


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def prometheus(target: str, tmp_path) -> Iterator[str]:
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
                      f"  - job_name: batchtop\n    static_configs:\n      - targets: ['{target}']\n")
    port = free_port()
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        until(lambda: _ready(url) or proc.poll() is not None, 60, "Prometheus to start")
        assert proc.poll() is None, proc.stderr.read()
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/-/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def query(prom: str, promql: str, at: float | None = None) -> list[dict]:
    params = {"query": promql} | ({"time": repr(at)} if at is not None else {})
    doc = httpx.get(prom + "/api/v1/query", params=params, timeout=10).json()
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def test_vllm_dashboard_promql_over_batchtop_serve_returns_batchtops_own_numbers(tmp_path):
    rng = random.Random(3)
    config = tiny_config(max_num_seqs=4, num_kv_blocks=128)
    with serving(config) as server, recording_proxy(server.url) as (target, bodies), prometheus(target, tmp_path) as prom:
        until(lambda: len(bodies) >= 2, 60, "two scrapes before any request")
        answers: list[int] = []
        stop_at = time.monotonic() + 4.0  # four clients keep a request each in flight for 4 s: KV is in use

        def client(n: int) -> None:
            while time.monotonic() < stop_at:
                answers.append(server.post("/v1/completions", json={
                    "prompt": [rng.randrange(256) for _ in range(8 + n)], "max_tokens": 48}).status_code)

        clients = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(60)
        assert answers and set(answers) == {200}
        wait_idle(server)
        seen = len(bodies)
        until(lambda: len(bodies) >= seen + 2, 60, "two scrapes after the last request")
        counts = server.engine.counters

        raw = query(prom, "vllm:generation_tokens_total[5m]")[0]["values"]
        first_t, first_v = raw[0]
        last_t = raw[-1][0]
        assert float(first_v) == 0 and last_t - first_t < 60  # the counter starts at 0 inside the 1 m range
        rate = query(prom, "rate(vllm:generation_tokens_total[1m])", at=last_t)[0]["value"][1]
        assert float(rate) * 60 == pytest.approx(counts.generated_tokens, rel=1e-9)
        prompt_rate = query(prom, "rate(vllm:prompt_tokens_total[1m])", at=last_t)[0]["value"][1]
        assert float(prompt_rate) * 60 == pytest.approx(counts.prompt_tokens, rel=1e-9)

        p99 = query(prom, "histogram_quantile(0.99, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket[1m])))",
                    at=last_t)[0]["value"][1]
        ttft = parse_exposition(bodies[-1], 0.0).histograms["ttft"]
        assert ttft.count == len(answers) and float(p99) == pytest.approx(ttft.quantile(0.99), rel=1e-9)

        kv = [float(v) for _, v in query(prom, "vllm:kv_cache_usage_perc[5m]", at=last_t)[0]["values"]]
        answered = iter([parse_exposition(b, 0.0).kv_usage for b in bodies])
        # every sample Prometheus kept is an answer, in order (a scrape it timed out on a busy host it drops)
        assert all(any(v == a for a in answered) for v in kv), (kv, [parse_exposition(b, 0).kv_usage for b in bodies])
        assert len(kv) >= 4 and max(kv) > 0
