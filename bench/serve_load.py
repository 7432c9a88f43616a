"""200 streaming clients over loopback against `batchtop serve --headless`, vs `batchtop --headless` alone.

    flock -x /tmp/batchtop-cpu.lock python bench/serve_load.py [--clients 200] [--model cpu-demo]

One workload (the bundled Azure conversation sample, scaled for a CPU as the dashboard plays it, all
arriving at once) runs twice, each in a fresh process with the same threads: once as a headless
workload, once sent by N concurrent streaming clients (one request each, 10% of them hanging up after
a random number of tokens). Printed:

- generated tok/s served / headless (target >= 0.9): the served run counts from the first request sent
  to the last answer read, the clients' own CPU time included (they share the machine's cores);
- TTFT and inter-token latency p50 / p99 as the clients saw them;
- /health round trip p50 / p99 while the server is under that load;
- token delivery (the end of the engine step that made a token -> its stream handler, from the server's
  batchtop:token_delivery_seconds) against the mean step time: well under one step means streaming adds
  no step of latency;
- the hang-ups: each was aborted (vllm:request_success_total{abort}) and the KV pool was empty at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from batchtop.core_engine.perf.metrics import percentiles
from batchtop.core_engine.run.resolve import resolve_config, resolve_workload
from batchtop.core_engine.workload.spec import load_workload

CLI = [sys.executable, "-m", "batchtop.tui"]


def headless(args, workload: Path, out: Path) -> dict:
    subprocess.run([*CLI, "--headless", "--model", args.model, "--workload", str(workload), "-o", str(out)],
                   check=True, stderr=subprocess.DEVNULL)
    return json.loads(out.read_text())


def start_server(args) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([*CLI, "serve", "--headless", "--model", args.model, "--port", "0"],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    for line in proc.stderr:
        found = re.search(r"on (http://\S+) ", line)
        if found:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep its summary lines flowing
            return proc, found.group(1)
    raise SystemExit(f"the server did not start (exit {proc.wait()})")


async def one_client(http: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int,
                     hang_up_after: int | None) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    sent = time.perf_counter()
    arrivals: list[float] = []
    async with http.stream("POST", url + "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.perf_counter())
                if hang_up_after is not None and len(arrivals) == hang_up_after:
                    break
    return {"sent": sent, "arrivals": arrivals, "hung_up": hang_up_after is not None}


def poll_health(url: str, stop: threading.Event, into: list[float]) -> None:
    """On its own thread with its own connection: the clients' event loop, busy with hundreds of streams,
    would delay a probe on it by its own backlog, which is not the server's."""
    with httpx.Client(timeout=600) as http:
        while not stop.is_set():
            t0 = time.perf_counter()
            response = http.get(url + "/health")
            into.append(time.perf_counter() - t0)
            assert response.status_code == 200
            stop.wait(0.1)


async def load(url: str, requests, hang_ups: dict[int, int]) -> tuple[list[dict], list[float], float]:
    limits = httpx.Limits(max_connections=len(requests) + 8, max_keepalive_connections=len(requests) + 8)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        stop, health = threading.Event(), []
        poller = threading.Thread(target=poll_health, args=(url, stop, health), daemon=True)
        poller.start()
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one_client(http, url, list(r.prompt_token_ids), r.max_tokens,
                                                    hang_ups.get(i)) for i, r in enumerate(requests)))
        wall = time.perf_counter() - t0
        stop.set()
        poller.join()
    return results, health, wall


def scrape(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    return {s.name + json.dumps({k: v for k, v in s.labels.items() if k not in ("model_name", "engine")},
                                sort_keys=True): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def ms(stats: dict) -> str:
    return f"p50 {1e3 * stats['p50']:.1f} ms, p99 {1e3 * stats['p99']:.1f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--hang-up-share", type=float, default=0.1)
    ap.add_argument("--model", default="cpu-demo")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    config = resolve_config(model=args.model, device="cpu")
    spec = resolve_workload(config, num_requests=args.clients, time_scale=0.0)
    requests = load_workload(spec, config.model.vocab_size)
    rng = random.Random(args.seed)
    hang_ups = {i: rng.randint(1, max(1, requests[i].max_tokens // 2))  # mid-stream: well before the end
                for i in rng.sample(range(len(requests)), round(args.hang_up_share * len(requests)))}

    with tempfile.TemporaryDirectory() as tmp:
        workload = Path(tmp) / "workload.jsonl"
        workload.write_text("".join(json.dumps({"id": r.id, "prompt_token_ids": list(r.prompt_token_ids),
                                                "max_tokens": r.max_tokens}) + "\n" for r in requests))
        base = headless(args, workload, Path(tmp) / "headless.json")

    proc, url = start_server(args)
    try:
        cpu0 = time.process_time()
        results, health, wall = asyncio.run(load(url, requests, hang_ups))
        client_cpu = time.process_time() - cpu0
        time.sleep(0.5)  # the hang-ups' aborts land at the next step
        m = scrape(url)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)

    generated = m["vllm:generation_tokens_total{}"]
    served_tps = generated / wall
    ttft = percentiles([r["arrivals"][0] - r["sent"] for r in results if r["arrivals"]])
    itl = percentiles([b - a for r in results for a, b in zip(r["arrivals"], r["arrivals"][1:])])
    steps = m["vllm:iteration_tokens_total_count{}"]
    delivery_mean = m["batchtop:token_delivery_seconds_sum{}"] / m["batchtop:token_delivery_seconds_count{}"]
    buckets = sorted((float(json.loads(k[len("batchtop:token_delivery_seconds_bucket"):])["le"]), v)
                     for k, v in m.items() if k.startswith("batchtop:token_delivery_seconds_bucket"))
    total = buckets[-1][1]
    delivery_p99_le = next(le for le, count in buckets if count >= 0.99 * total)
    complete = [r for r in results if not r["hung_up"]]
    assert all(len(r["arrivals"]) == requests[i].max_tokens for i, r in enumerate(results) if not r["hung_up"])

    print(f"model {args.model}, {len(requests)} clients ({len(hang_ups)} hang up), "
          f"{sum(r.max_tokens for r in requests)} tokens asked for, torch threads: default")
    print(f"headless:  {base['tokens']['generated']} tokens in {base['wall_time_s']:.1f} s = "
          f"{base['throughput_tok_s']:.1f} tok/s")
    print(f"served:    {generated:.0f} tokens in {wall:.1f} s = {served_tps:.1f} tok/s "
          f"-> {served_tps / base['throughput_tok_s']:.3f} of headless (target >= 0.9); the clients used "
          f"{client_cpu:.1f} s of CPU beside it")
    print(f"TTFT {ms(ttft)}; inter-token {ms(itl)} (as {len(complete)} complete clients saw them)")
    print(f"/health under load: {ms(percentiles(health))} over {len(health)} probes")
    print(f"token delivery (step end -> stream handler): mean {1e3 * delivery_mean:.2f} ms, p99 <= "
          f"{1e3 * delivery_p99_le:.2f} ms; mean step {1e3 * wall / steps:.1f} ms ({steps:.0f} steps)")
    aborted = m['vllm:request_success_total{"finished_reason": "abort"}']
    print(f"hang-ups aborted: {aborted:.0f} of {len(hang_ups)}; KV used at the end: "
          f"{m['vllm:kv_cache_usage_perc{}']:.0%}")


if __name__ == "__main__":
    main()
