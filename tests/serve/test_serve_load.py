"""Many clients at once: exact lengths, disconnects that free KV blocks, /metrics equal to the engine's counters."""

from __future__ import annotations

import asyncio
import random

import httpx
import openai

from tests.support.serving import Running, serving, wait_idle


async def finish(client: openai.AsyncOpenAI, prompt: list[int], max_tokens: int) -> list[int]:
    stream = await client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, stream=True)
    tokens: list[int] = []
    async for chunk in stream:
        tokens += chunk.choices[0].model_extra["token_ids"]
    return tokens


async def leave_early(client: openai.AsyncOpenAI, prompt: list[int], started: asyncio.Event,
                      leave: asyncio.Event) -> int:
    """Read two chunks, then hang up while the request is still running."""
    stream = await client.completions.create(model="tiny", prompt=prompt, max_tokens=400, stream=True)
    seen = 0
    async for _ in stream:
        seen += 1
        if seen == 2:
            started.set()
            await leave.wait()
            break
    await stream.close()
    return seen


def test_64_streams_finish_exactly_and_10_that_hang_up_are_aborted_and_free_their_blocks():
    rng = random.Random(0)
    lengths = [rng.randint(4, 24) for _ in range(64)]

    async def drive(server: Running) -> tuple[list[list[int]], int]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        started = [asyncio.Event() for _ in range(10)]
        leave = asyncio.Event()
        quitters = [asyncio.create_task(leave_early(client, [rng.randrange(512) for _ in range(8)], s, leave))
                    for s in started]
        await asyncio.gather(*(s.wait() for s in started))  # all ten are generating
        used_while_running = server.engine.allocator.num_used_blocks
        finishers = asyncio.gather(*(finish(client, [rng.randrange(512) for _ in range(rng.randint(1, 16))], n)
                                     for n in lengths))
        leave.set()
        await asyncio.gather(*quitters)
        outputs = await finishers
        await client.close()
        return outputs, used_while_running

    with serving() as server:
        outputs, used_while_running = asyncio.run(drive(server))
        assert [len(o) for o in outputs] == lengths
        assert used_while_running > 0
        wait_idle(server)
        c = server.engine.counters
        assert c.completed == 64 and c.submitted == 74
        metrics = server.scrape()
        assert metrics["vllm:request_success_total{finished_reason=abort}"] == 10
        assert metrics["vllm:request_success_total{finished_reason=length}"] == c.completed
        assert metrics["vllm:generation_tokens_total"] == c.generated_tokens
        assert metrics["vllm:prompt_tokens_total"] == c.prompt_tokens
        assert metrics["vllm:num_preemptions_total"] == c.preemptions
        assert metrics["vllm:iteration_tokens_total_count"] == c.steps
        assert metrics["vllm:iteration_tokens_total_sum"] == c.computed_tokens
        assert metrics["vllm:time_to_first_token_seconds_count"] == 74
        assert metrics["vllm:e2e_request_latency_seconds_count"] == 64
        assert metrics["vllm:request_queue_time_seconds_count"] == 64
        assert metrics["vllm:inter_token_latency_seconds_count"] == c.generated_tokens - 74
        assert metrics["vllm:num_requests_running"] == 0 and metrics["vllm:num_requests_waiting"] == 0
        assert metrics["vllm:kv_cache_usage_perc"] == 0
        assert metrics["vllm:estimated_flops_per_gpu_total"] > metrics["vllm:estimated_read_bytes_per_gpu_total"] > 0
        assert metrics["batchtop:token_delivery_seconds_count"] >= 64
        info = "vllm:cache_config_info{block_size=4,cache_dtype=float32,enable_prefix_caching=True,num_gpu_blocks=1024}"
        assert metrics[info] == 1
        assert metrics["batchtop:max_num_seqs"] == 16 and metrics["batchtop:mode{mode=continuous}"] == 1


def test_a_client_that_hangs_up_has_its_request_aborted_at_once_and_its_blocks_freed():
    with serving() as server:
        body = {"prompt": [1] * 8, "max_tokens": 3000, "stream": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=10) as response:
            assert next(line for line in response.iter_lines() if line).startswith("data: ")
            assert server.engine.allocator.num_used_blocks > 0
        wait_idle(server, timeout_s=5)
        c = server.engine.counters
        assert c.completed == 0 and c.generated_tokens < 3000
        assert server.scrape()["vllm:request_success_total{finished_reason=abort}"] == 1


def test_a_non_streaming_client_that_gives_up_has_its_request_aborted_too():
    with serving() as server:
        try:
            httpx.post(server.url + "/v1/completions", json={"prompt": [1] * 8, "max_tokens": 4000}, timeout=0.3)
            raise AssertionError("the answer came before the client gave up")
        except httpx.ReadTimeout:
            pass
        wait_idle(server, timeout_s=5)
        assert server.engine.counters.completed == 0 and server.engine.counters.generated_tokens < 4000
