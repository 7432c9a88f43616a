"""A model directory that cannot be used exits 2 before any weight is loaded, naming the file, the
tensor and the numbers at fault."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.model import checkpoint
from batchtop.tui.cli import main
from tests.support.exits import assert_exit_2

pytest.importorskip("transformers")


def headless(model_dir, *args):
    return CliRunner().invoke(main, ["--headless", "--model", str(model_dir), "--device", "cpu", "--dtype",
                                     "float32", "--num-requests", "2", "--time-scale", "0", *args])


@pytest.fixture
def model_dir(hf_checkpoints, tmp_path):
    """A private copy of the Qwen3 checkpoint to break."""
    return shutil.copytree(hf_checkpoints["qwen3"], tmp_path / "qwen3")


def edit_config(model_dir, **changes):
    path = model_dir / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def edit_weights(model_dir, edit):
    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})
    return path


def test_a_good_checkpoint_runs(model_dir):
    result = headless(model_dir)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["config"]["model"]["architecture"] == "Qwen3ForCausalLM"


def test_missing_config_json(model_dir):
    (model_dir / "config.json").unlink()
    assert_exit_2(headless(model_dir), "no config.json", str(model_dir))


def test_unknown_architecture_is_named_with_the_supported_list(model_dir):
    edit_config(model_dir, architectures=["GPT2LMHeadModel"])
    assert_exit_2(headless(model_dir), "architecture 'GPT2LMHeadModel' is not supported",
                  "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM")


def test_unsupported_rope_type(model_dir):
    edit_config(model_dir, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6})
    assert_exit_2(headless(model_dir), "config.json: RoPE type 'yarn' is not supported")


def test_missing_tensor_is_named_with_its_shape(model_dir):
    edit_weights(model_dir, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    assert_exit_2(headless(model_dir), "tensor model.layers.1.mlp.up_proj.weight is missing", "[96, 64]")


def test_wrong_shape_names_tensor_file_and_both_shapes(model_dir):
    def shrink(tensors):
        tensors["model.layers.0.self_attn.k_norm.weight"] = torch.ones(16)
    path = edit_weights(model_dir, shrink)
    assert_exit_2(headless(model_dir), f"{path}: tensor model.layers.0.self_attn.k_norm.weight has shape [16]",
                  "needs [32]")


def test_unexpected_tensor(model_dir):
    def add(tensors):
        tensors["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(64)
    edit_weights(model_dir, add)
    assert_exit_2(headless(model_dir), "unexpected tensor model.layers.0.self_attn.o_proj.bias")


@pytest.mark.parametrize("damage", ["header", "truncated"])
def test_corrupt_safetensors_file(model_dir, damage):
    path = model_dir / "model.safetensors"
    if damage == "header":
        with path.open("r+b") as f:
            f.seek(8)
            f.write(b"{not json")
    else:
        os.truncate(path, path.stat().st_size - 100)
    assert_exit_2(headless(model_dir), f"{path}: not a readable safetensors file")


def test_missing_shard_named_by_the_index(model_dir):
    path = model_dir / "model.safetensors"
    names = list(load_file(path))
    (model_dir / checkpoint.INDEX_FILE).write_text(json.dumps(
        {"weight_map": {n: ("model.safetensors" if i else "model-00002.safetensors") for i, n in enumerate(names)}}))
    assert_exit_2(headless(model_dir), "lists model-00002.safetensors, which is not in")


def test_a_model_that_cannot_fit_is_refused_with_both_numbers(model_dir, monkeypatch):
    monkeypatch.setattr(checkpoint, "available_memory", lambda device: 100_000)
    assert_exit_2(headless(model_dir), "the weights need 0.00 GiB (float32)", "has 0.00 GiB available")


def test_not_a_preset_nor_a_directory(tmp_path):
    assert_exit_2(headless(tmp_path / "nowhere"), "is neither a preset (auto, tiny, cpu-demo", "no such file or directory")


def test_a_model_path_in_a_symlink_loop_says_so(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert_exit_2(headless(loop), "is neither a preset", "a symlink loop")


def test_text_prompt_without_a_tokenizer_names_the_line(model_dir, tmp_path):
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"prompt_len": 3, "max_tokens": 2}\n{"prompt": "hello there", "max_tokens": 2}\n')
    (model_dir / "tokenizer.json").unlink()
    for model in (str(model_dir), "tiny"):
        assert_exit_2(headless(model, "--workload", str(workload)), f"{workload}:2: a text prompt needs a tokenizer")


def test_sharegpt_without_a_tokenizer(tmp_path):
    dataset = tmp_path / "sharegpt.json"
    dataset.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi"},
                                                      {"from": "gpt", "value": "hello"}]}]))
    assert_exit_2(headless("tiny", "--workload", str(dataset)), f"{dataset}: a ShareGPT dataset is text")


def test_a_config_that_claims_a_million_layers_is_refused_by_the_files_before_anything_is_built(model_dir):
    edit_config(model_dir, num_hidden_layers=1_000_000)
    assert_exit_2(headless(model_dir), f"{model_dir / 'config.json'}: num_hidden_layers is 1000000, but the "
                                       "checkpoint has tensors for 2 layers (none for model.layers.2)")


def test_a_config_with_fewer_layers_than_the_files_names_the_first_extra_tensor(model_dir):
    edit_config(model_dir, num_hidden_layers=1)
    assert_exit_2(headless(model_dir), "unexpected tensor model.layers.1.", "has num_hidden_layers 1")


def test_a_config_that_claims_more_parameters_than_the_files_hold_is_refused_first(model_dir):
    edit_config(model_dir, hidden_size=1 << 40, head_dim=1 << 36, intermediate_size=1 << 40)
    assert_exit_2(headless(model_dir), "config.json: describes", "parameters, more than the",
                  "bytes of its safetensors files hold")


@pytest.mark.parametrize("changes, message", [
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, "'rope_theta' must be > 0, got 0"),
    ({"rope_parameters": None, "rope_theta": -10000.0}, "'rope_theta' must be > 0, got -10000.0"),
    ({"rope_parameters": None, "rope_theta": float("nan")}, "'rope_theta' must be a finite number, got nan"),
    ({"rms_norm_eps": -1e-6}, "'rms_norm_eps' must be >= 0, got -1e-06"),
    ({"rms_norm_eps": float("inf")}, "'rms_norm_eps' must be a finite number, got inf"),
    ({"initializer_range": float("-inf")}, "'initializer_range' must be a finite number, got -inf"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": float("nan")}}, "'rope_parameters.factor' must be a finite"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 0, "low_freq_factor": 1, "high_freq_factor": 4,
                          "original_max_position_embeddings": 32}}, "'factor' must be > 0, got 0"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
                          "original_max_position_embeddings": 0}}, "'original_max_position_embeddings' must be >= 1"),
    ({"architectures": ["Qwen3ForCausalLM"], "extra": [1, {"deep": float("nan")}]}, "'extra[1].deep' must be a finite"),
])
def test_a_number_that_would_run_wrong_is_exit_2_naming_its_key(model_dir, changes, message):
    edit_config(model_dir, **changes)  # json.dumps writes NaN and Infinity, which Python's json reads back
    result = headless(model_dir)
    assert_exit_2(result, f"{model_dir / 'config.json'}: ", message)
    assert "Traceback" not in result.output


@pytest.mark.parametrize("text, message", [
    ('{"a": ' * 100_000 + "1" + "}" * 100_000, "not JSON that can be read (nested too deeply)"),
    ('{"vocab_size": 1' + "0" * 5000 + "}", "not JSON that can be read (Exceeds the limit (4300 digits)"),
])
def test_a_config_json_python_cannot_read_is_exit_2_naming_the_file(model_dir, text, message):
    (model_dir / "config.json").write_text(text)
    result = headless(model_dir)
    assert_exit_2(result, f"{model_dir / 'config.json'}: {message}")
    assert "Traceback" not in result.output


def test_a_rope_theta_past_a_float_is_exit_2(model_dir):
    edit_config(model_dir, rope_parameters=None)
    path = model_dir / "config.json"
    path.write_text(path.read_text()[:-1] + ', "rope_theta": 1' + "0" * 400 + "}")
    assert_exit_2(headless(model_dir), "'rope_theta' must be a finite number, got an integer of 401 digits")


def test_a_chat_template_file_past_its_cap_is_refused_by_its_size(model_dir, monkeypatch):
    from batchtop.core_engine.model import tokenizer
    monkeypatch.setattr(tokenizer, "MAX_TEMPLATE_BYTES", 1024)
    (model_dir / "chat_template.jinja").write_text("{{ messages }}" + " " * 4096)
    with pytest.raises(BadInput, match=r"chat_template.jinja: .*larger than 1 KiB"):
        tokenizer.Tokenizer.from_dir(model_dir)
