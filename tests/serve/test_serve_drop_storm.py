"""Round 4 of the hardening: 300 streaming clients that hang up mid-stream at once, running and
queued alike. Every request is aborted or finished, every KV block comes back, nothing is left running
or waiting, and /health answers throughout (how fast is measured in bench/serve_load.py, not here)."""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import openai

from tests.support.serving import Running, serving, wait_idle

CLIENTS = 300
HANG_S = 10.0  # a /health that takes this long is hung, whatever the machine's load


async def drop_after(client: openai.AsyncOpenAI, prompt: list[int], chunks: int) -> str:
    """Read `chunks` chunks (0: hang up before the first, while queued), then hang up."""
    try:
        stream = await client.completions.create(model="tiny", prompt=prompt, max_tokens=400, stream=True)
    except openai.APIStatusError as exc:  # a full queue says 503: refused, never admitted
        return f"refused {exc.status_code}"
    seen = 0
    async for _ in stream:
        seen += 1
        if seen >= chunks:
            break
    await stream.close()
    return "dropped"


async def probe_health(url: str, stop: asyncio.Event, latencies: list[float]) -> None:
    async with httpx.AsyncClient(timeout=HANG_S) as http:
        while not stop.is_set():
            start = time.perf_counter()
            response = await http.get(url + "/health")
            latencies.append(time.perf_counter() - start)
            assert response.status_code == 200
            await asyncio.sleep(0.05)


def test_300_streams_that_hang_up_mid_stream_free_every_block_and_health_keeps_answering():
    rng = random.Random(4)

    async def storm(server: Running) -> tuple[list[str], list[float]]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        stop, latencies = asyncio.Event(), []
        prober = asyncio.create_task(probe_health(server.url, stop, latencies))
        outcomes = await asyncio.gather(*(drop_after(client, [rng.randrange(512) for _ in range(rng.randint(4, 32))],
                                                     rng.choice((0, 1, 2, 3))) for _ in range(CLIENTS)))
        stop.set()
        await prober
        await client.close()
        return outcomes, latencies

    with serving() as server:
        outcomes, latencies = asyncio.run(storm(server))
        wait_idle(server)
        assert latencies and max(latencies) < HANG_S
        assert set(outcomes) <= {"dropped", "refused 503"} and outcomes.count("dropped") > 16
        assert server.engine.allocator.num_used_blocks == 0
        metrics = server.scrape()
        assert metrics["vllm:num_requests_running"] == 0 and metrics["vllm:num_requests_waiting"] == 0
        assert metrics["vllm:kv_cache_usage_perc"] == 0
        c = server.engine.counters
        aborted = metrics["vllm:request_success_total{finished_reason=abort}"]
        assert c.submitted == outcomes.count("dropped")  # every admitted request ended: aborted, or done first
        assert aborted + c.completed == c.submitted and aborted > 16
