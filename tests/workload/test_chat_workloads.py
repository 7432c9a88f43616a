"""Chat workloads: a JSONL `messages` line goes through the model's chat template (`prompt` stays raw
text), the bundled chat requests are the default for a model with a template, and every malformed
`messages` field, or one the model cannot render, exits 2 naming the file, the line and the field."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from batchtop.core_engine.model.tokenizer import Tokenizer
from batchtop.core_engine.workload.spec import DEFAULT_CHAT
from batchtop.tui.cli import main
from tests.support.gguf_files import Q, plain_llama, write_gguf
from tests.support.hf_checkpoints import SENTENCES

pytest.importorskip("transformers")


def run(model, *args):
    return CliRunner().invoke(main, ["--headless", "--model", str(model), "--device", "cpu", "--dtype", "float32",
                                     "--time-scale", "0", "--ignore-eos", *args])


def test_messages_are_rendered_by_the_template_and_a_prompt_is_raw_text(hf_checkpoints, tmp_path):
    model_dir = hf_checkpoints["qwen2"]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": SENTENCES[0]}]
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "chat", "messages": messages, "max_tokens": 3}) + "\n"
                        + json.dumps({"id": "raw", "prompt": SENTENCES[0], "max_tokens": 3}) + "\n")
    result = run(model_dir, "--workload", str(workload))
    assert result.exit_code == 0, result.output
    tok = Tokenizer.from_dir(model_dir)
    chat = tok.encode_chat(messages)
    assert chat[-len(tok.encode("<|assistant|>\n", add_special_tokens=False)):] == \
        tok.encode("<|assistant|>\n", add_special_tokens=False)  # the generation prompt is added
    assert json.loads(result.stdout)["tokens"]["prompt"] == len(chat) + len(tok.encode(SENTENCES[0]))


def test_a_gguf_model_gets_the_bundled_chat_requests_by_default_and_a_preset_the_trace(tmp_path):
    path = tmp_path / "chat.gguf"
    write_gguf(path, plain_llama(), "llama", Q.F16, context_length=1024)
    result = run(path, "--num-requests", "3")
    assert result.exit_code == 0, result.output
    m = json.loads(result.stdout)
    assert m["workload"]["source"] == f"bundled:{DEFAULT_CHAT.name}" and m["requests"]["completed"] == 3
    assert m["workload"]["output_scale"] == 0.25  # the file's 1024-token cap is 256 on a CPU
    assert m["tokens"]["generated"] == 3 * 256
    preset = run("tiny", "--num-requests", "3")
    assert json.loads(preset.stdout)["workload"]["source"] == "bundled:azure_conv_sample.csv"


def test_the_bundled_chat_requests_are_varied_conversations_with_the_traces_arrivals():
    lines = [json.loads(line) for line in DEFAULT_CHAT.read_text(encoding="utf-8").splitlines()]
    assert 280 <= len(lines) <= 320
    firsts = [line["messages"][-1]["content"] for line in lines]
    assert len(set(firsts)) == len(firsts)  # no request is repeated
    arrivals = [line["arrival_s"] for line in lines]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0 and arrivals[-1] > 60  # minutes of real traffic
    assert any(line["messages"][0]["role"] == "system" for line in lines)
    assert any(len(line["messages"]) >= 3 for line in lines)  # multi-turn conversations too


@pytest.mark.parametrize("messages,needle", [
    ("hello", 'messages must be a non-empty list of {"role": ..., "content": ...} objects'),
    ([], "messages must be a non-empty list"),
    ([{"role": "user"}], 'messages[0] must be an object with string "role" and "content"'),
    ([{"role": "user", "content": "hi"}, ["user", "hi"]], "messages[1] must be an object"),
    ([{"role": "user", "content": 3}], 'messages[0] must be an object with string "role" and "content"'),
])
def test_a_messages_field_of_the_wrong_shape_is_named_with_its_line(hf_checkpoints, tmp_path, messages, needle):
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"prompt_len": 4, "max_tokens": 2}\n' + json.dumps({"messages": messages, "max_tokens": 2}))
    result = run(hf_checkpoints["llama"], "--workload", str(workload))
    assert result.exit_code == 2 and f"{workload}:2: {needle}" in result.output, result.output


def test_messages_with_a_prompt_too_is_refused(hf_checkpoints, tmp_path):
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}], "prompt": "hi", "max_tokens": 2}))
    result = run(hf_checkpoints["llama"], "--workload", str(workload))
    assert result.exit_code == 2 and "w.jsonl:1: give one of prompt, messages" in result.output


def test_messages_without_a_chat_template_exit_2_and_say_what_to_give_instead(hf_checkpoints, tmp_path):
    model_dir = shutil.copytree(hf_checkpoints["llama"], tmp_path / "no-template")
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
    result = run(model_dir, "--workload", str(workload))
    assert result.exit_code == 2 and f"{workload}:1: messages need the model's chat template, and this model has " \
                                     "none" in result.output, result.output
    preset = run("tiny", "--workload", str(workload))
    assert preset.exit_code == 2 and f"{workload}:1: a messages prompt needs a tokenizer" in preset.output


def test_a_template_that_refuses_the_conversation_is_named(hf_checkpoints, tmp_path):
    model_dir = shutil.copytree(hf_checkpoints["llama"], tmp_path / "strict")
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}x"
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"messages": [{"role": "assistant", "content": "hi"}], "max_tokens": 2}))
    result = run(model_dir, "--workload", str(workload))
    assert result.exit_code == 2 and f"{workload}:1: messages: chat template: user first" in result.output
