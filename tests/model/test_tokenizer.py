"""The tokenizer API the workload reader, the dashboard and the server use: streamed text, chat templates,
and the server's text path on a real tokenizer."""

from __future__ import annotations

import json
import shutil

import openai
import pytest

from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.model.hf_config import read_model_config
from batchtop.core_engine.model.tokenizer import Tokenizer
from tests.conftest import tiny_config
from tests.support.hf_checkpoints import SENTENCES
from tests.support.serving import serving

transformers = pytest.importorskip("transformers")

TEXT = "Batching 😀 refills slots: naïve café, 你好!"
# A template in the style real checkpoints ship: a default system turn, loops, and raise_exception.
CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set messages = messages[1:] %}{% else %}{% set system = 'You are terse.' %}{% endif %}"
    "{{ bos_token }}[SYS]{{ system }}[/SYS]\n"
    "{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "[{{ m['role'] | upper }}] {{ m['content'] | trim }}{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}[ASSISTANT] {% endif %}")


def test_streamed_text_is_the_whole_decode_and_waits_for_split_characters(hf_checkpoints):
    tok = Tokenizer.from_dir(hf_checkpoints["llama"])
    ids = tok.encode(TEXT)
    prompt, output = ids[:4], ids[4:]
    stream = tok.stream(prompt)
    pieces = [stream.push(t) for t in output]
    assert "".join(pieces) == tok.decode(output) == TEXT[len(tok.decode(prompt)):]
    assert "" in pieces  # the emoji's first bytes: nothing to show until the character is whole
    assert "\ufffd" not in "".join(pieces)


@pytest.fixture
def chat_dir(hf_checkpoints, tmp_path):
    model_dir = shutil.copytree(hf_checkpoints["qwen3"], tmp_path / "chat")
    config_path = model_dir / "tokenizer_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "chat_template": CHAT_TEMPLATE}))
    return model_dir


def test_chat_template_renders_what_transformers_renders(chat_dir):
    messages = [{"role": "user", "content": " What is a KV block? "},
                {"role": "assistant", "content": "Sixteen tokens of cache."}, {"role": "user", "content": "And?"}]
    theirs = transformers.AutoTokenizer.from_pretrained(chat_dir)
    ours = Tokenizer.from_dir(chat_dir)
    for generation_prompt in (True, False):
        want = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        assert ours.apply_chat_template(messages, add_generation_prompt=generation_prompt) == want
    assert ours.apply_chat_template(messages).startswith("<s>[SYS]You are terse.[/SYS]\n[USER] What is")


def test_break_and_continue_render_as_transformers_renders_them(chat_dir):
    config_path = chat_dir / "tokenizer_config.json"
    template = ("{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
                "{{ m['content'] }};{% if m['content'] == 'stop' %}{% break %}{% endif %}{% endfor %}")
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "chat_template": template}))
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
                {"role": "assistant", "content": "stop"}, {"role": "user", "content": "b"}]
    want = transformers.AutoTokenizer.from_pretrained(chat_dir).apply_chat_template(messages, tokenize=False)
    assert Tokenizer.from_dir(chat_dir).apply_chat_template(messages) == want == "a;stop;"


def test_a_template_that_refuses_a_conversation_says_why(chat_dir):
    with pytest.raises(BadInput, match="chat template: unknown role tool"):
        Tokenizer.from_dir(chat_dir).apply_chat_template([{"role": "tool", "content": "{}"}])


def test_without_a_template_or_a_tokenizer(hf_checkpoints, tmp_path):
    model_dir = shutil.copytree(hf_checkpoints["qwen2"], tmp_path / "plain")
    (model_dir / "tokenizer_config.json").write_text("{}")
    with pytest.raises(BadInput, match="no chat_template"):
        Tokenizer.from_dir(model_dir).apply_chat_template([{"role": "user", "content": "hi"}])
    (model_dir / "tokenizer.json").unlink()
    assert Tokenizer.from_dir(model_dir) is None


def test_eos_ids_come_from_generation_config_then_config(hf_checkpoints, tmp_path):
    model_dir = shutil.copytree(hf_checkpoints["qwen2"], tmp_path / "eos")
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    assert Tokenizer.from_dir(model_dir).eos_token_ids == (7, 9)
    (model_dir / "generation_config.json").unlink()
    assert Tokenizer.from_dir(model_dir).eos_token_ids == (1,)  # config.json's


def test_a_model_directory_serves_text_and_chat(hf_checkpoints):
    """The Tokenizer is the server's TextCodec: text prompts, chat templates and text answers."""
    model_dir = hf_checkpoints["qwen3"]
    tok = Tokenizer.from_dir(model_dir)
    with serving(tiny_config(model=read_model_config(model_dir), num_kv_blocks=256), codec=tok) as running:
        c = openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0)
        whole = c.completions.create(model="tiny", prompt=SENTENCES[0], max_tokens=8, temperature=0,
                                     extra_body={"ignore_eos": True})
        ids = whole.choices[0].model_extra["token_ids"]
        assert whole.usage.prompt_tokens == len(tok.encode(SENTENCES[0])) and len(ids) == 8
        text = whole.choices[0].text
        assert text and tok.decode(ids).startswith(text)  # a character cut at the end may be held back
        messages = [{"role": "user", "content": "What is a KV block?"}]
        chat = c.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=0)
        assert chat.usage.prompt_tokens == len(tok.encode_chat(messages))
