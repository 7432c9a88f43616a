"""Real text through a model directory: JSONL text prompts, ShareGPT datasets, EOS and finish reasons."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from batchtop.core_engine.config import config_from_dict
from batchtop.core_engine.model.tokenizer import Tokenizer
from batchtop.core_engine.trace.trace import read_trace
from batchtop.tui.cli import main
from tests.support.hf_checkpoints import SENTENCES

pytest.importorskip("transformers")


def headless(model_dir, *args):
    result = CliRunner().invoke(main, ["--headless", "--model", str(model_dir), "--device", "cpu", "--dtype",
                                       "float32", "--time-scale", "0", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def finish_events(trace_path) -> dict[str, dict]:
    return {e["request_id"]: e for e in read_trace(str(trace_path)).events if e["type"] == "finish"}


def test_jsonl_text_prompts_are_tokenized_by_the_model_directory(hf_checkpoints, tmp_path):
    model_dir = hf_checkpoints["qwen2"]
    workload = tmp_path / "w.jsonl"
    workload.write_text("\n".join(json.dumps({"id": f"t{i}", "prompt": text, "max_tokens": 5})
                                  for i, text in enumerate(SENTENCES)) + '\n{"prompt_len": 4, "max_tokens": 5}\n')
    m = headless(model_dir, "--workload", str(workload), "--ignore-eos")
    tok = Tokenizer.from_dir(model_dir)
    assert m["requests"] == {"submitted": 6, "completed": 6, "rejected": 0}
    assert m["tokens"]["prompt"] == sum(len(tok.encode(text)) for text in SENTENCES) + 4
    assert m["tokens"]["generated"] == 30 and m["finish_reasons"] == {"length": 6, "stop": 0}


def test_a_sharegpt_dataset_gives_one_request_per_conversation(hf_checkpoints, tmp_path):
    model_dir = hf_checkpoints["llama"]
    dataset = tmp_path / "sharegpt.json"
    conversations = [
        [{"from": "human", "value": SENTENCES[0]}, {"from": "gpt", "value": SENTENCES[1]},
         {"from": "human", "value": "and then?"}, {"from": "gpt", "value": "more"}],
        [{"from": "system", "value": "be brief"}, {"from": "human", "value": SENTENCES[2]},
         {"from": "gpt", "value": SENTENCES[3]}],
        [{"from": "human", "value": "a question nobody answered"}],  # skipped, as vLLM's benchmark does
    ]
    dataset.write_text(json.dumps([{"id": f"c{i}", "conversations": c} for i, c in enumerate(conversations)]))
    m = headless(model_dir, "--workload", str(dataset), "--ignore-eos")
    tok = Tokenizer.from_dir(model_dir)
    assert m["requests"]["completed"] == 2
    # the model has a chat template, so each human turn goes through it as a user message
    assert m["tokens"]["prompt"] == sum(len(tok.encode_chat([{"role": "user", "content": SENTENCES[i]}]))
                                        for i in (0, 2))
    assert m["tokens"]["generated"] == sum(len(tok.encode(SENTENCES[i], add_special_tokens=False)) for i in (1, 3))
    assert m["workload"]["source"] == str(dataset)


@pytest.mark.parametrize("content,needle", [
    ({"conversations": "hi"}, 'entry [0]: expected an object with a "conversations" list'),
    ([1, 2], "entry [0]: expected an object"),
])
def test_a_malformed_sharegpt_entry_is_named(hf_checkpoints, tmp_path, content, needle):
    dataset = tmp_path / "bad.json"
    dataset.write_text(json.dumps([content]))
    result = CliRunner().invoke(main, ["--headless", "--model", str(hf_checkpoints["llama"]), "--workload",
                                       str(dataset)])
    assert result.exit_code == 2 and f"{dataset}: {needle}" in result.output


def test_eos_stops_a_request_early_unless_ignored_and_the_reason_reaches_metrics_and_trace(hf_checkpoints,
                                                                                         tmp_path):
    model_dir = shutil.copytree(hf_checkpoints["qwen3"], tmp_path / "qwen3")
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "a", "prompt": SENTENCES[0], "max_tokens": 10}) + "\n")
    full = tmp_path / "full.jsonl"
    headless(model_dir, "--workload", str(workload), "--record", str(full), "--record-text")  # EOS 1 never comes
    output = finish_events(full)["a"]["output_token_ids"]
    assert len(output) == 10
    eos = next(t for i, t in enumerate(output) if i >= 2 and t not in output[:i])  # first emitted at step i
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [99999, eos]}))

    stopped = tmp_path / "stopped.jsonl"
    m = headless(model_dir, "--workload", str(workload), "--record", str(stopped), "--record-text")
    event = finish_events(stopped)["a"]
    assert event["finish_reason"] == "stop" and event["output_token_ids"] == output[:output.index(eos) + 1]
    assert m["finish_reasons"] == {"length": 0, "stop": 1} and m["tokens"]["generated"] == output.index(eos) + 1

    m = headless(model_dir, "--workload", str(workload), "--ignore-eos")
    assert m["finish_reasons"] == {"length": 1, "stop": 0} and m["tokens"]["generated"] == 10


def test_compare_runs_a_model_directory_and_replay_shows_what_was_recorded(hf_checkpoints, tmp_path):
    model_dir = hf_checkpoints["llama"]  # llama3 rope scaling and tied embeddings must survive the trace
    out = tmp_path / "c.json"
    result = CliRunner().invoke(main, ["compare", "--model", str(model_dir), "--device", "cpu", "--dtype", "float32",
                                       "--num-requests", "6", "--ignore-eos", "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["static"]["tokens"]["generated"] == doc["continuous"]["tokens"]["generated"] > 0
    assert doc["continuous"]["config"]["model"]["checkpoint"] == str(model_dir)

    trace = tmp_path / "t.jsonl"
    live = headless(model_dir, "--num-requests", "3", "--record", str(trace))
    replayed = CliRunner().invoke(main, ["replay", str(trace), "--headless"])
    assert replayed.exit_code == 0, replayed.output
    model = json.loads(replayed.stdout)["config"]["model"]
    assert model == live["config"]["model"]
    assert model["architecture"] == "LlamaForCausalLM" and model["rope_scaling"]["rope_type"] == "llama3"
    assert config_from_dict(read_trace(str(trace)).header["config"]).model.tie_word_embeddings
