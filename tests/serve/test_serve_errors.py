"""Every bad input gets its status code and a message naming what is wrong; the engine never sees it."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from batchtop.core_engine.engine.engine import Engine
from tests.conftest import fail_on_call, tiny_config
from tests.support.serving import serving


@pytest.fixture(scope="module")
def server():
    with serving(tiny_config(max_num_seqs=4, num_kv_blocks=32), api_key="s3cret") as running:
        yield running


KEY = {"Authorization": "Bearer s3cret"}


def error_of(response: httpx.Response) -> dict:
    return response.json()["error"]


@pytest.mark.parametrize("body, param, message", [
    ({"prompt": [1, 2], "max_tokens": "5"}, "max_tokens", "valid integer"),
    ({"prompt": [1, 2], "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ({"prompt": [1, "2"]}, "prompt", "list of token ids"),
    ({"prompt": [[1], [2]]}, "prompt", "one request per prompt"),
    ({"prompt": [1], "temperature": True}, "temperature", "valid number"),
    ({"prompt": [1], "temperature": -0.5}, "temperature", "greater than or equal to 0"),
    ({"prompt": [1], "top_p": 0}, "top_p", "greater than 0"),
    ({"prompt": [1], "seed": 1 << 70}, "seed", "less than or equal"),
    ({"prompt": [1], "stop": 7}, "stop", "string or a list of strings"),
    ({"prompt": [1], "stream_options": {"include_usage": "yes"}, "stream": True}, "stream_options.include_usage",
     "valid boolean"),
    ({"prompt": [1], "stream_options": {"include_usage": True}}, "stream_options", "only allowed when stream"),
    ({"prompt": [1], "n": 2}, "n", "n=2 is not supported"),
    ({"prompt": [1], "best_of": 3}, "best_of", "not supported"),
    ({"prompt": [1], "logprobs": 1}, "logprobs", "not supported"),
    ({"max_tokens": 3}, "prompt", "Field required"),
    ({"prompt": []}, "prompt", "must not be empty"),
    ({"prompt": [1, 512]}, "prompt", "outside the vocabulary [0, 512)"),
])
def test_wrong_fields_are_400_naming_the_field(server, body, param, message):
    submitted = server.engine.counters.submitted
    response = server.post("/v1/completions", json=body, headers=KEY)
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["param"] == param and message in error["message"] and error["code"] == 400
    assert error["type"] == "BadRequestError"
    assert server.engine.counters.submitted == submitted


def test_unknown_fields_are_ignored_and_neutral_values_of_unsupported_ones_accepted(server):
    body = {"prompt": [1, 2], "max_tokens": 2, "user": "x", "n": 1, "logprobs": None, "repetition_penalty": 1.0,
            "frobnicate": True}
    assert server.post("/v1/completions", json=body, headers=KEY).status_code == 200


def test_invalid_json_and_a_body_that_is_not_an_object_are_400(server):
    bad = server.post("/v1/completions", content=b'{"prompt": [1,', headers={**KEY, "content-type": "application/json"})
    assert bad.status_code == 400 and "not valid JSON" in error_of(bad)["message"]
    array = server.post("/v1/completions", json=[1, 2], headers=KEY)
    assert array.status_code == 400 and "JSON object" in error_of(array)["message"]


def test_prompt_plus_max_tokens_over_max_model_len_or_the_kv_pool_is_400_with_both_numbers(server):
    submitted = server.engine.counters.submitted
    long = server.post("/v1/completions", json={"prompt": [1] * 10, "max_tokens": 4090}, headers=KEY)
    assert long.status_code == 400
    assert error_of(long)["message"] == "prompt 10 + max_tokens 4090 = 4100 exceeds max_model_len 4096"
    assert error_of(long)["param"] == "max_tokens"
    pool = server.post("/v1/completions", json={"prompt": [1] * 10, "max_tokens": 200}, headers=KEY)
    assert pool.status_code == 400
    assert "prompt 10 + max_tokens 200 needs 53 KV blocks of 4 tokens, the pool has 32" in error_of(pool)["message"]
    assert server.engine.counters.submitted == submitted


def test_without_max_tokens_a_chat_style_request_gets_all_the_pool_allows(server):
    out = server.post("/v1/completions", json={"prompt": [1] * 10, "max_tokens": None}, headers=KEY)
    assert out.status_code == 200 and out.json()["usage"]["completion_tokens"] == 32 * 4 + 1 - 10


def test_the_api_key_guards_v1_but_not_health_or_metrics(server):
    body = {"prompt": [1], "max_tokens": 1}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        response = server.post("/v1/completions", json=body, headers=headers)
        assert response.status_code == 401 and "API key" in error_of(response)["message"]
    assert server.get("/v1/models").status_code == 401
    assert server.get("/v1/models", headers=KEY).status_code == 200
    assert server.get("/health").status_code == 200 and server.get("/metrics").status_code == 200
    # the key is checked before the body is read: no key and bad JSON is still 401
    assert server.post("/v1/completions", content=b"{", headers={"content-type": "application/json"}).status_code == 401


def test_a_body_over_4_mib_is_413_declared_or_chunked(server):
    big = json.dumps({"prompt": [100] * (1 << 20), "max_tokens": 1}).encode()
    assert len(big) > 4 << 20
    declared = server.post("/v1/completions", content=big, headers={**KEY, "content-type": "application/json"})
    assert declared.status_code == 413 and "4 MiB" in error_of(declared)["message"]
    chunks = (big[i:i + 65536] for i in range(0, len(big), 65536))  # no Content-Length: chunked encoding
    chunked = server.post("/v1/completions", content=chunks, headers={**KEY, "content-type": "application/json"})
    assert chunked.status_code == 413


def test_a_full_waiting_queue_is_503_with_retry_after():
    with serving(tiny_config(max_num_seqs=1, num_kv_blocks=1024), max_waiting=2) as server:
        body = {"prompt": [1, 2], "max_tokens": 2000, "stream": True}
        with httpx.Client(timeout=10) as http:
            with http.stream("POST", server.url + "/v1/completions", json=body) as running:
                lines = running.iter_lines()  # kept: a dropped line iterator closes the connection
                next(line for line in lines if line)  # it holds the only slot
                queued = [http.stream("POST", server.url + "/v1/completions", json=body) for _ in range(2)]
                threads = [threading.Thread(target=q.__enter__) for q in queued]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                full = http.post(server.url + "/v1/completions", json={"prompt": [1], "max_tokens": 1})
                assert full.status_code == 503 and full.headers["Retry-After"] == "1"
                assert "waiting queue is full (2 waiting, --max-waiting 2)" in error_of(full)["message"]
                for q in queued:
                    q.__exit__(None, None, None)


def test_an_engine_failure_answers_500_to_in_flight_requests_and_health_turns_unhealthy():
    engine = Engine(tiny_config())
    engine.runner.run = fail_on_call(engine.runner.run, 5, "device lost")
    with serving(engine=engine, stop_on_engine_failure=False) as server:
        response = server.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 50})
        assert response.status_code == 500 and "device lost" in error_of(response)["message"]
        health = server.get("/health")
        assert health.status_code == 503 and "engine has stopped: RuntimeError: device lost" in health.text
        again = server.post("/v1/completions", json={"prompt": [1], "max_tokens": 1})
        assert again.status_code == 500
        assert server.scrape()["vllm:request_success_total{finished_reason=error}"] == 1


def test_a_stream_in_flight_when_the_engine_fails_ends_with_an_error_event_and_the_server_stops():
    engine = Engine(tiny_config())
    engine.runner.run = fail_on_call(engine.runner.run, 5, "device lost")
    with serving(engine=engine) as server:
        body = {"prompt": [1, 2, 3], "max_tokens": 50, "stream": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=10) as response:
            events = [line for line in response.iter_lines() if line]
        assert len(events) == 4 + 2  # four tokens, the error, [DONE]
        assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == 500
        assert events[-1] == "data: [DONE]"
        server.stopped.wait(10)
        assert server.stopped.is_set()
