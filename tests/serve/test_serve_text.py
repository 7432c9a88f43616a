"""The text path through a TextCodec (a byte-level stand-in here): text prompts, chat, stop strings."""

from __future__ import annotations

import openai
import pytest

from tests.support.serving import ByteCodec, serving, wait_idle

CODEC = ByteCodec()


@pytest.fixture(scope="module")
def server():
    with serving(codec=CODEC) as running:
        yield running


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_a_text_prompt_is_encoded_and_the_answer_decoded_the_same_streamed_or_not(server):
    c = client(server)
    whole = c.completions.create(model="tiny", prompt="Hello, batchtop", max_tokens=12, temperature=0)
    ids = whole.choices[0].model_extra["token_ids"]
    assert whole.usage.prompt_tokens == len("Hello, batchtop") and whole.choices[0].text == CODEC.decode(ids)
    chunks = list(c.completions.create(model="tiny", prompt="Hello, batchtop", max_tokens=12, temperature=0,
                                       stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == whole.choices[0].text and len(chunks) == 12


def test_chat_applies_the_template_streams_the_role_first_and_answers_as_the_assistant(server):
    c = client(server)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    whole = c.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0)
    assert whole.choices[0].message.role == "assistant"
    assert whole.usage.prompt_tokens == len(CODEC.encode_chat(messages))
    chunks = list(c.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0,
                                            stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].object == "chat.completion.chunk"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == whole.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="roles must be"):
        c.chat.completions.create(model="tiny", messages=[{"role": "robot", "content": "x"}])


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_ends_the_answer_before_it_and_frees_the_request(server, stream):
    c = client(server)
    full = c.completions.create(model="tiny", prompt="stop here", max_tokens=40, temperature=0).choices[0].text
    stop = full[10:12]
    expected = full[:full.index(stop)]
    stops_before = server.scrape()["vllm:request_success_total{finished_reason=stop}"]
    if stream:
        chunks = list(c.completions.create(model="tiny", prompt="stop here", max_tokens=40, temperature=0,
                                           stop=[stop, "never"], stream=True))
        text, finish = "".join(ch.choices[0].text for ch in chunks), chunks[-1].choices[0].finish_reason
    else:
        choice = c.completions.create(model="tiny", prompt="stop here", max_tokens=40, temperature=0,
                                      stop=stop).choices[0]
        text, finish = choice.text, choice.finish_reason
    assert (text, finish) == (expected, "stop")
    wait_idle(server)
    assert server.scrape()["vllm:request_success_total{finished_reason=stop}"] == stops_before + 1
