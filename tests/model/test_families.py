"""families.py's rows are what the config.json writer and reader, the GGUF reader and the GGUF loader
know about architectures: every row round-trips through the one config.json writer and transformers
reads what it writes, and a row registered by a test alone makes a new family load, from config.json
and from a GGUF file, with no other file touched."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from batchtop.core_engine.config import ModelConfig, preset
from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.model import families
from batchtop.core_engine.model.export import save_weights
from batchtop.core_engine.model.families import ALWAYS, Flag, ModelFamily, by_hf_architecture
from batchtop.core_engine.model.hf_config import config_json, read_model_config
from batchtop.core_engine.model.parameters import build_model
from batchtop.core_engine.model.sources import read_gguf_config
from batchtop.core_engine.model.weights import load_model
from batchtop.core_engine.worker.model_runner import ModelRunner
from tests.conftest import tiny_config
from tests.model.test_checkpoint_parity import PROMPT, paged_logits
from tests.support import gguf_files
from tests.support.gguf_files import Q, write_gguf
from tests.support.hf_checkpoints import COMMON

transformers = pytest.importorskip("transformers")

TOY = ModelFamily("Toy", ("ToyForCausalLM",), "toy", "toy", qkv_bias=ALWAYS, o_bias=Flag("toy_out_bias"),
                  tie_word_embeddings=True, sliding_window="flag",
                  gguf_renames=(("post_attention_layernorm", "toy_ffn_norm"),))


def flags_unlike_defaults(family: ModelFamily) -> dict[str, bool]:
    """ModelConfig flags for the family with every keyed flag away from its default (a key shared by two
    flags takes one value), so a writer that dropped a key would read back differently."""
    by_key: dict[str, bool] = {}
    values = []
    for flag in (family.qkv_bias, family.o_bias, family.mlp_bias):
        values.append(flag.default if flag.fixed else by_key.setdefault(flag.key, not flag.default))
    return dict(attention_bias=values[0], o_proj_bias=values[1], mlp_bias=values[2], qk_norm=family.qk_norm)


def family_config(family: ModelFamily, **overrides) -> ModelConfig:
    return dataclasses.replace(preset("tiny"), architecture=family.hf_architecture, head_dim=32,
                               **flags_unlike_defaults(family), **overrides)


def write_config(model_dir, config: ModelConfig, drop=()) -> None:
    model_dir.mkdir(exist_ok=True)
    data = config_json(config, "float32", 0, (1,))
    (model_dir / "config.json").write_text(json.dumps({k: v for k, v in data.items() if k not in drop}))


def same(a: ModelConfig, b: ModelConfig) -> bool:
    return dataclasses.replace(a, name="x", checkpoint=None, eos_token_ids=()) == \
        dataclasses.replace(b, name="x", checkpoint=None, eos_token_ids=())


@pytest.mark.parametrize("family", families.FAMILIES, ids=lambda f: f.model_type)
def test_every_family_reads_back_what_the_one_config_json_writer_writes(tmp_path, family):
    config = family_config(family)
    write_config(tmp_path, config)
    assert same(read_model_config(tmp_path), config)
    theirs = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(tmp_path))
    assert type(theirs).__name__ == family.hf_architecture
    assert sum(p.numel() for p in theirs.parameters()) == config.num_params()  # biases, q/k norms, head_dim


def test_config_json_without_architectures_falls_back_to_model_type(tmp_path):
    write_config(tmp_path, family_config(families.FAMILIES[-1]), drop=("architectures",))
    assert read_model_config(tmp_path).architecture == families.FAMILIES[-1].hf_architecture
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(BadInput, match=r"config.json: model_type 'gpt2' is not supported \(supported: llama, mistral"):
        read_model_config(tmp_path)


@pytest.mark.parametrize("overrides, message", [
    (dict(architecture="LlamaForCausalLM", attention_bias=True, o_proj_bias=False, mlp_bias=False, qk_norm=False),
     "tiny: 'attention_bias' in a LlamaForCausalLM's config.json sets q/k/v biases and an o_proj bias together"),
    (dict(architecture="Qwen2ForCausalLM", attention_bias=False, o_proj_bias=False, mlp_bias=False, qk_norm=False),
     "tiny: a Qwen2ForCausalLM always has q/k/v biases, this model does not"),
    (dict(architecture="Qwen3ForCausalLM", attention_bias=False, o_proj_bias=False, mlp_bias=False, qk_norm=False),
     "tiny: a Qwen3ForCausalLM always has q/k RMSNorm, this model does not"),
    (dict(architecture="MistralForCausalLM", mlp_bias=True),
     "tiny: a MistralForCausalLM has no MLP biases, this model does"),
    (dict(architecture="GPT2LMHeadModel"), "tiny: architecture 'GPT2LMHeadModel' is not supported"),
])
def test_config_json_refuses_a_model_its_family_cannot_describe(overrides, message):
    with pytest.raises(BadInput, match=message):
        config_json(dataclasses.replace(preset("tiny"), **overrides), "float32", 0, (1,))


def test_a_row_registered_alone_makes_a_new_family_load_from_config_json(tmp_path, monkeypatch):
    with pytest.raises(BadInput, match="architecture 'ToyForCausalLM' is not supported"):
        by_hf_architecture("ToyForCausalLM", "here")
    monkeypatch.setattr(families, "FAMILIES", families.FAMILIES + (TOY,))
    with pytest.raises(BadInput, match=r"here: architecture 'Nope' is not supported \(supported: .*, ToyForCausalLM\)"):
        by_hf_architecture("Nope", "here")

    config = family_config(TOY, tie_word_embeddings=True, max_position_embeddings=512)
    written = config_json(config, "float32", 0, (1,))
    assert (written["model_type"], written["toy_out_bias"], written["use_sliding_window"]) == ("toy", True, False)
    assert "attention_bias" not in written and "mlp_bias" not in written  # keys the toy does not have
    write_config(tmp_path, config, drop=("tie_word_embeddings",))  # the row's default: tied
    (tmp_path / "config.json").write_text(json.dumps({**json.loads((tmp_path / "config.json").read_text()),
                                                      "use_sliding_window": True, "sliding_window": 100}))
    read = read_model_config(tmp_path)
    assert same(read, dataclasses.replace(config, max_position_embeddings=100))  # the "flag" window applies

    built = build_model(read, "cpu", torch.float32, seed=5)
    save_weights(built.state_dict(), tmp_path)
    loaded = load_model(read, "cpu", torch.float32)
    assert loaded.state_dict().keys() == built.state_dict().keys()
    assert all(torch.equal(t, built.state_dict()[n]) for n, t in loaded.state_dict().items())


def llama_with_biases(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**COMMON, attention_bias=True, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale = 1.0 if "embed" in name else 0.3
            param.copy_(1 + 0.2 * torch.randn_like(param) if name.endswith("norm.weight") else
                        scale * torch.randn_like(param))
    return model


def test_a_row_registered_alone_makes_a_new_family_load_from_a_gguf_file(tmp_path, monkeypatch):
    """The toy's file: llama.cpp names under the row's rename, q/k rows as transformers holds them (the
    row says llama.cpp did not permute them); the logits are transformers' Llama-with-biases logits."""
    monkeypatch.setattr(families, "FAMILIES", families.FAMILIES + (TOY,))
    monkeypatch.setattr(gguf_files, "LAYER_NAMES", {**gguf_files.LAYER_NAMES,
                                                    "post_attention_layernorm": "toy_ffn_norm"})
    path = tmp_path / "toy.gguf"
    held = write_gguf(path, llama_with_biases(), "toy", Q.F16)
    config = read_gguf_config(path)
    assert (config.architecture, config.attention_bias, config.o_proj_bias, config.mlp_bias) == \
        ("ToyForCausalLM", True, True, False)
    with torch.no_grad():
        want = held(torch.tensor([PROMPT])).logits[0]
    torch.testing.assert_close(paged_logits(ModelRunner(tiny_config(model=config)), PROMPT), want,
                               rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(families, "FAMILIES", families.FAMILIES[:-1] + (dataclasses.replace(TOY, gguf_renames=()),))
    with pytest.raises(BadInput, match="unexpected tensor blk.0.toy_ffn_norm.weight"):
        ModelRunner(tiny_config(model=config))
