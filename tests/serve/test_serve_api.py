"""`batchtop serve` through the official openai SDK: completions, streaming, usage, models, chat refusal."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import make_requests
from tests.support.serving import serving, wait_idle


@pytest.fixture(scope="module")
def server():
    with serving() as running:
        yield running


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_a_completion_returns_exactly_max_tokens_token_ids_and_its_usage(server):
    before = server.engine.counters
    out = client(server).completions.create(model="tiny", prompt=[5, 6, 7, 8], max_tokens=7)
    choice = out.choices[0]
    assert choice.finish_reason == "length" and len(choice.model_extra["token_ids"]) == 7
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (4, 7, 11)
    after = server.engine.counters
    assert after.generated_tokens - before.generated_tokens == 7
    assert after.prompt_tokens - before.prompt_tokens == 4


def test_a_stream_sends_one_chunk_per_step_and_usage_last(server):
    chunks = list(client(server).completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=5, stream=True,
                                                   stream_options={"include_usage": True}))
    tokens = [c.choices[0].model_extra["token_ids"] for c in chunks if c.choices]
    assert tokens == [[t] for t in sum(tokens, [])] and len(tokens) == 5
    assert [c.choices[0].finish_reason for c in chunks if c.choices] == [None] * 4 + ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert all(c.usage is None for c in chunks[:-1])


def test_greedy_streaming_and_non_streaming_give_the_same_tokens_and_seeded_sampling_repeats(server):
    c = client(server)
    whole = c.completions.create(model="tiny", prompt=[9, 8, 7], max_tokens=6, temperature=0)
    streamed = [t for ch in c.completions.create(model="tiny", prompt=[9, 8, 7], max_tokens=6, temperature=0,
                                                 stream=True) for t in ch.choices[0].model_extra["token_ids"]]
    assert whole.choices[0].model_extra["token_ids"] == streamed
    seeded = [c.completions.create(model="tiny", prompt=[9, 8, 7], max_tokens=6, temperature=1.0, top_p=0.9,
                                   seed=42).choices[0].model_extra["token_ids"] for _ in range(2)]
    assert seeded[0] == seeded[1]


def test_models_lists_the_served_model_and_another_name_is_404(server):
    c = client(server)
    assert [m.id for m in c.models.list().data] == ["tiny"]
    with pytest.raises(openai.NotFoundError, match="`gpt-4` does not exist"):
        c.completions.create(model="gpt-4", prompt=[1], max_tokens=1)


def test_chat_and_text_prompts_without_a_tokenizer_are_400_saying_so(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError, match="needs a tokenizer") as chat:
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert "chat template" in str(chat.value)
    with pytest.raises(openai.BadRequestError, match="text prompt needs a tokenizer"):
        c.completions.create(model="tiny", prompt="hello", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="a stop string needs a tokenizer"):
        c.completions.create(model="tiny", prompt=[1], max_tokens=2, stop=["\n"])


def test_a_workload_replays_beside_the_clients():
    workload = make_requests(6, seed=2, prompt=(2, 8), output=(20, 40))
    with serving(workload=workload) as server:
        outputs = [client(server).completions.create(model="tiny", prompt=[1, 2], max_tokens=4) for _ in range(3)]
        assert all(o.usage.completion_tokens == 4 for o in outputs)
        wait_idle(server)
        assert server.engine.counters.completed == 9
