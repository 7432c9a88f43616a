"""Hostile and broken chat templates (they come with downloaded model directories): every render is
bounded in time, memory, output and recursion, runs off the event loop in a process of its own, and
fails as OpenAI's error object while the server goes on answering everything else."""

from __future__ import annotations

import threading

import httpx
import pytest

from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.model.chat_template import MAX_VALUE_BYTES
from batchtop.core_engine.serve.prompt_text import start_chat
from tests.support.serving import ByteCodec, serving

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def chat(server, body: dict = CHAT) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)


def error_of(response: httpx.Response) -> dict:
    assert response.headers["content-type"] == "application/json", response.text
    return response.json()["error"]


def test_a_render_that_never_ends_is_cut_off_while_health_and_other_requests_are_answered():
    with serving(codec=ByteCodec(NESTED_LOOPS), chat_seconds=1.0) as server:
        answers: list[httpx.Response] = []
        stuck = threading.Thread(target=lambda: answers.append(chat(server)))
        stuck.start()
        health = server.get("/health")
        completion = server.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        rendering = stuck.is_alive()  # the render is still going on while both were answered
        stuck.join(30)
        assert health.status_code == 200 and completion.status_code == 200 and rendering
        assert answers[0].status_code == 500
        assert "chat template (tests/serving.py) failed: the chat template ran past 1 s" in error_of(answers[0])["message"]
        again = chat(server)  # the template is still the same: the same answer, from a working process
        assert again.status_code == 500 and "ran past 1 s" in error_of(again)["message"]


# One template, one branch per case (the first message's content picks it), so one server meets them all
# and must answer every one after the others.
CASES = {
    "repeat-constant": ("{{ 'a' * 3000000000 }}", 500,
                        f"repeats a str of 1 items 3000000000 times, over the {MAX_VALUE_BYTES >> 20} MiB"),
    "repeat-message": ("{{ messages[0].content * 100000000 }}", 500, "repeats a str of 14 items 100000000 times"),
    "power": ("{{ 7 ** 100000000 }}", 500, "raises 7 to the power 100000000"),
    "recursion": ("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}", 500, "recursed too deeply"),
    "range": ("{{ range(10**8) | length }}", 500, "OverflowError: Range too big"),
    "width": ("{{ '%99999999999d' % 1 }}", 500, "ran out of memory"),
    "doubling": ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
                 "{{ ns.s }}", 500, "ran out of memory"),
    "divide": ("{{ 1 / 0 }}", 500, "ZeroDivisionError"),
    "surrogate": ("{{ '\\ud800' }}", 500, "wrote a lone surrogate (U+D800, not text) at character 0"),
    "sandbox": ("{{ messages.append(1) }}", 500,
                "stopped by the sandbox: access to attribute 'append' of 'list' object is unsafe"),
    "too-long": ("{% for i in range(100000) %}{{ messages[0].content }}{% endfor %}", 400,
                 "messages: the chat template renders this conversation to more than 4095 bytes of prompt; the "
                 "longest prompt this server takes is 4095 tokens (max_model_len 4096, a KV pool of 4096 tokens)"),
    "refuse": ("{{ raise_exception('this model takes no system turn') }}", 400,
               "messages: chat template: this model takes no system turn"),
    "undefined": ("{{ messages[0].nothing.deeper }}", 400,
                  "messages: chat template: 'dict object' has no attribute 'nothing'"),
}
DISPATCH = "".join(f"{{% if messages[0].content == '{name}' %}}{snippet}{{% endif %}}"
                   for name, (snippet, _, _) in CASES.items()) + "{{ messages[0].content }}"


@pytest.fixture(scope="module")
def hostile():
    with serving(codec=ByteCodec(DISPATCH), chat_seconds=20) as server:  # time enough on a busy machine
        yield server


@pytest.mark.parametrize("case", CASES)
def test_a_template_that_fails_answers_openais_error_and_the_server_goes_on(hostile, case):
    _, status, message = CASES[case]
    submitted = hostile.engine.counters.submitted
    response = chat(hostile, {"messages": [{"role": "user", "content": case}], "max_tokens": 2})
    assert response.status_code == status, response.text
    error = error_of(response)
    assert message in error["message"] and error["code"] == status
    assert error["param"] == ("messages" if status == 400 else None)
    assert hostile.get("/health").status_code == 200
    assert chat(hostile, {"messages": [{"role": "user", "content": "fine"}], "max_tokens": 1}).status_code == 200
    assert hostile.engine.counters.submitted == submitted + 1  # only the good chat reached the engine


def test_a_template_that_does_not_parse_is_refused_when_the_server_starts_naming_its_file():
    with pytest.raises(BadInput, match=r"tests/serving.py: the chat template does not parse: line 1: "):
        start_chat(ByteCodec("{% for m in messages %}{{ m.content }}"))


def test_a_killed_render_process_is_replaced_and_the_next_render_works():
    codec = ByteCodec("{% if messages[0].content == 'hang' %}" + NESTED_LOOPS + "{% endif %}ok")
    process = start_chat(codec, seconds=0.5)
    try:
        assert process.render([{"role": "user", "content": "fine"}], 100) == "ok"
        process._proc.kill()  # as the kernel's OOM killer or a crash would
        with pytest.raises(RuntimeError, match="process died"):
            process.render([{"role": "user", "content": "fine"}], 100)
        assert process.render([{"role": "user", "content": "fine"}], 100) == "ok"
        with pytest.raises(RuntimeError, match="ran past 0.5 s"):
            process.render([{"role": "user", "content": "hang"}], 100)
        assert process.render([{"role": "user", "content": "fine"}], 100) == "ok"
        assert process.restarts == 1
    finally:
        process.close()
