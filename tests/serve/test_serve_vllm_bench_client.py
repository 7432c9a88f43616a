"""`vllm bench serve --backend openai` drives batchtop serve: the body its client sends is accepted, and
the stream has what it times (one chunk per token carrying text, then a usage chunk, then [DONE])."""

from __future__ import annotations

import json

import httpx

from tests.support.serving import ByteCodec, serving, wait_idle

# The fields vLLM 0.32's openai-completions client puts in every request (neutral values included):
# rejecting any of them would fail every request of the benchmark.
VLLM_CLIENT_BODY = {"model": "tiny", "prompt": "a random prompt", "repetition_penalty": 1.0, "max_tokens": 8,
                    "logprobs": None, "stream": True, "stream_options": {"include_usage": True},
                    "ignore_eos": True, "temperature": 0.0}


def test_vllm_bench_serve_requests_stream_one_text_chunk_per_token_then_usage_then_done():
    with serving(codec=ByteCodec()) as server:
        events = []
        with httpx.stream("POST", server.url + "/v1/completions", json=VLLM_CLIENT_BODY, timeout=30,
                          headers={"x-request-id": "bench-0"}) as response:
            assert response.status_code == 200
            events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
        wait_idle(server)

    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    token_chunks = [c for c in chunks if c.get("choices")]
    assert len(token_chunks) == VLLM_CLIENT_BODY["max_tokens"]  # its ITLs are the gaps between these
    assert all(isinstance(c["choices"][0]["text"], str) for c in token_chunks)
    usage = chunks[-1]
    assert not usage.get("choices") and usage["usage"]["completion_tokens"] == VLLM_CLIENT_BODY["max_tokens"]
    assert usage["usage"]["prompt_tokens"] == len(VLLM_CLIENT_BODY["prompt"].encode())
