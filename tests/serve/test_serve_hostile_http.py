"""Hostile HTTP against a real server: bodies that are not UTF-8 or nest too deep, lone surrogates, methods
the routes do not take, sockets that say nothing and bodies that stall, a text prompt that can never fit,
and tokenization that takes long; every answer is OpenAI's error object and the event loop stays free."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.serve import app as app_module
from batchtop.core_engine.serve import bodies
from batchtop.core_engine.serve.limits import RequestGuards
from tests.support.serving import ByteCodec, serving

KEY = {"Authorization": "Bearer s3cret"}


@pytest.fixture(scope="module")
def server():
    with serving(codec=ByteCodec(), api_key="s3cret") as running:
        yield running


def post(server, path: str, content: bytes | str, **headers) -> httpx.Response:
    return httpx.post(server.url + path, content=content, timeout=10,
                      headers={**KEY, "content-type": "application/json", **headers})


def error_of(response: httpx.Response) -> dict:
    assert response.headers["content-type"] == "application/json", response.text
    return response.json()["error"]


@pytest.mark.parametrize("body, message", [
    (b'{"prompt": "caf\xe9", "max_tokens": 1}', "the body is not valid JSON: it is not UTF-8 text (byte 0xe9 at offset 15)"),
    (b"[" * 5000 + b"]" * 5000, "it is nested too deeply"),
    (b'{"prompt": [1], "max_tokens": 1' + b"0" * 5000 + b"}", "Exceeds the limit (4300 digits)"),
    (b'{"prompt": [1], "max_tokens": 1', "the body is not valid JSON: Expecting ',' delimiter"),
])
def test_a_body_that_cannot_be_read_as_json_is_400_saying_why(server, body, message):
    response = post(server, "/v1/completions", body)
    assert response.status_code == 400
    error = error_of(response)
    assert message in error["message"] and error["type"] == "BadRequestError", error


@pytest.mark.parametrize("body, param", [
    ({"prompt": "a\ud800b", "max_tokens": 1}, "prompt"),
    ({"prompt": [1], "max_tokens": 1, "stop": ["ok", "\udfff"]}, "stop"),
])
def test_a_lone_surrogate_is_400_naming_the_field(server, body, param):
    response = post(server, "/v1/completions", json.dumps(body))  # json.dumps escapes it as \\ud800
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["param"] == param and "a lone surrogate (U+D" in error["message"]


@pytest.mark.parametrize("message, param", [
    ({"role": "user", "content": "x\ud83d"}, "messages[0].content"),
    ({"role": "user", "content": [{"type": "text", "text": "\udc00"}]}, "messages[0].content"),
    ({"role": "us\ud800er", "content": "hi"}, "messages[0].role"),
])
def test_a_lone_surrogate_in_a_chat_is_400_naming_the_message(server, message, param):
    response = post(server, "/v1/chat/completions", json.dumps({"messages": [message], "max_tokens": 1}))
    assert response.status_code == 400 and error_of(response)["param"] == param


def test_an_error_that_quotes_a_lone_surrogate_still_renders(server):
    response = post(server, "/v1/completions", json.dumps({"model": "\ud800", "prompt": [1], "max_tokens": 1}))
    assert response.status_code == 404 and "The model `\ud800` does not exist" in error_of(response)["message"]


@pytest.mark.parametrize("method, path", [("HEAD", "/v1/completions"), ("OPTIONS", "/v1/completions"),
                                          ("HEAD", "/v1/chat/completions"), ("GET", "/v1/chat/completions"),
                                          ("OPTIONS", "/v1/models"), ("POST", "/health")])
def test_a_method_a_route_does_not_take_is_405_with_allow_and_the_error_object(server, method, path):
    response = httpx.request(method, server.url + path, headers=KEY, timeout=10)
    assert response.status_code == 405
    allowed = response.headers["Allow"]
    assert allowed == ("POST" if "completions" in path else "GET, HEAD")
    if method != "HEAD":  # a HEAD answer has no body
        error = error_of(response)
        assert error["message"] == f"{method} is not allowed on {path}; it answers {allowed}"
        assert error["code"] == 405 and error["type"] == "MethodNotAllowedError"


def test_head_on_a_get_route_answers_as_get_without_a_body_and_an_unknown_route_is_404(server):
    assert httpx.head(server.url + "/health", timeout=10).status_code == 200
    assert httpx.head(server.url + "/v1/models", headers=KEY, timeout=10).status_code == 200
    missing = httpx.get(server.url + "/v2/nothing", headers=KEY, timeout=10)
    assert missing.status_code == 404 and error_of(missing)["message"] == "there is no route /v2/nothing"


def test_the_key_guards_every_path_but_health_and_metrics_and_a_bare_bearer_is_refused(server):
    for path in ("/v1/models", "/v2/nothing", "//v1/models", "/metrics/"):
        assert httpx.get(server.url + path, timeout=10).status_code == 401, path
    for authorization in ("Bearer", "Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret"):
        response = httpx.get(server.url + "/v1/models", headers={"Authorization": authorization}, timeout=10)
        assert response.status_code == 401, authorization


@pytest.mark.parametrize("key", ["", " ", "two words", "caf\u00e9", "tab\there"])
def test_an_api_key_no_client_can_send_is_refused(key):
    with pytest.raises(ConfigError, match="--api-key: the API key is"):
        RequestGuards(None, api_key=key)


def test_a_text_prompt_that_can_never_fit_is_refused_by_its_size_before_it_is_tokenized(server):
    submitted = server.engine.counters.submitted
    response = post(server, "/v1/completions", json.dumps({"prompt": "a" * 3_800_000, "max_tokens": 1}))
    assert response.status_code == 400
    error = error_of(response)
    assert error["param"] == "prompt"
    assert error["message"] == ("prompt: the text is 3800000 bytes; the longest prompt this server takes is 4095 "
                                "tokens (max_model_len 4096, a KV pool of 4096 tokens), at most 4095 bytes with "
                                "this tokenizer")
    assert server.engine.counters.submitted == submitted


class SlowCodec(ByteCodec):
    """A tokenizer that takes as long as the test says (a 4 MB prompt on a real one takes seconds) and
    knows no byte bound, so every text is tokenized."""

    def __init__(self) -> None:
        super().__init__()
        self.started, self.release = threading.Event(), threading.Event()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if text == "slow":
            self.started.set()
            self.release.wait(30)
        return super().encode(text, add_special_tokens)

    def max_text_bytes(self, tokens: int) -> None:
        return None


def test_tokenizing_and_rendering_happen_off_the_event_loop():
    codec = SlowCodec()
    with serving(codec=codec) as server:
        answers: list[httpx.Response] = []
        slow = threading.Thread(target=lambda: answers.append(server.post(
            "/v1/completions", json={"prompt": "slow", "max_tokens": 2})))
        slow.start()
        assert codec.started.wait(10)
        health = server.get("/health")  # answered while the prompt is still being tokenized
        other = server.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                          "max_tokens": 2})
        still_tokenizing = slow.is_alive()
        codec.release.set()
        slow.join(10)
        assert health.status_code == 200 and other.status_code == 200 and still_tokenizing
        assert answers[0].status_code == 200 and answers[0].json()["usage"]["prompt_tokens"] == 4


def test_a_body_is_parsed_and_validated_off_the_event_loop(monkeypatch):
    """pydantic takes most of a second over 100,000 chat messages; a parse held here stands for it."""
    started, release = threading.Event(), threading.Event()

    def slow_parse(data: bytes, kind):
        if b"slow" in data:
            started.set()
            release.wait(30)
        return bodies.parse_body(data, kind)

    monkeypatch.setattr(app_module, "parse_body", slow_parse)
    with serving() as server:
        answers: list[httpx.Response] = []
        slow = threading.Thread(target=lambda: answers.append(server.post(
            "/v1/completions", json={"prompt": [1, 2], "max_tokens": 1, "user": "slow"})))
        slow.start()
        assert started.wait(10)
        health = server.get("/health")
        still_parsing = slow.is_alive()
        release.set()
        slow.join(10)
        assert health.status_code == 200 and still_parsing and answers[0].status_code == 200


def read_until_closed(sock: socket.socket, timeout_s: float) -> bytes:
    sock.settimeout(timeout_s)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_socket_that_says_nothing_or_trickles_its_headers_is_closed_and_others_go_on():
    with serving(codec=ByteCodec(), head_timeout_s=0.5) as server:
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as idle, \
                socket.create_connection((host, int(port))) as trickle:
            trickle.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            for _ in range(5):  # a header byte every 0.2 s: never a whole head
                time.sleep(0.2)
                try:
                    trickle.sendall(b"X")
                except OSError:
                    break
            assert server.get("/health").status_code == 200  # the others are served meanwhile
            assert read_until_closed(idle, 10) == b""
            assert read_until_closed(trickle, 10) == b""
        with httpx.Client(timeout=10) as client:  # a keep-alive client between requests is left alone
            assert client.get(server.url + "/health").status_code == 200
            time.sleep(1.0)
            assert client.get(server.url + "/health").status_code == 200


def test_a_body_that_stalls_is_cut_off_with_408_and_the_connection_closed():
    with serving(codec=ByteCodec(), body_timeout_s=0.5) as server:
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as stalled:
            stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 100\r\n\r\n{\"prompt\": [1, 2")
            answer = read_until_closed(stalled, 10)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower()
        assert json.loads(body)["error"]["message"] == "the request body did not arrive within 0.5 s"
        assert server.engine.counters.submitted == 0
        assert server.post("/v1/completions", json={"prompt": [1], "max_tokens": 1}).status_code == 200
