"""Seed-OSS, the family added as one row of families.py: Llama with q/k/v and o_proj biases and its own
head_dim, under its own names (SeedOssForCausalLM, llama.cpp's `seed_oss` with `post_attention_norm`).

A tiny random checkpoint made by transformers runs through batchtop as a Hugging Face directory and as
a GGUF file named the way llama.cpp names Seed-OSS tensors (gguf's own tensor map, not batchtop's), and
the GGUF file's export loads back into transformers: the same logits everywhere, at fp32 tolerance."""

from __future__ import annotations

import dataclasses
import json

import gguf
import pytest
import torch

from batchtop.core_engine.model.export import save_tokenizer
from batchtop.core_engine.model.gguf_export import export_gguf
from batchtop.core_engine.model.gguf_file import read_header
from batchtop.core_engine.model.hf_config import read_model_config
from batchtop.core_engine.model.parameters import hf_parameters
from batchtop.core_engine.model.sources import read_gguf_config
from batchtop.core_engine.worker.model_runner import ModelRunner
from tests.conftest import tiny_config
from tests.model.test_checkpoint_parity import PROMPT, paged_logits
from tests.support import gguf_files
from tests.support.gguf_files import Q, write_gguf
from tests.support.hf_checkpoints import COMMON, tokenizer

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "SeedOssForCausalLM"):
    pytest.skip("this transformers has no Seed-OSS", allow_module_level=True)


def seed_oss_model(seed: int = 0) -> torch.nn.Module:
    """Biases on q/k/v and o_proj (the two keys Seed-OSS has), head_dim 32 (not hidden 64 / 4 heads);
    every weight random, norms and biases included, so no flag passes by being zeros or ones."""
    torch.manual_seed(seed)
    config = transformers.SeedOssConfig(**COMMON, head_dim=32, attention_bias=True, attention_out_bias=True,
                                        mlp_bias=False, tie_word_embeddings=False)
    model = transformers.SeedOssForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn_like(param))
            else:
                param.copy_((1.0 if "embed" in name else 0.3) * torch.randn_like(param))
    return model


def logits_of(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([PROMPT])).logits[0]


def llama_cpp_names(monkeypatch) -> None:
    """Write GGUF tensors under the names llama.cpp's converter gives Seed-OSS (gguf's tensor map)."""
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.SEED_OSS, COMMON["num_hidden_layers"])
    monkeypatch.setattr(gguf_files, "gguf_name", lambda hf: names.get_name(hf, try_suffixes=(".weight", ".bias")))


def test_a_seed_oss_directory_runs_as_transformers_runs_it(tmp_path):
    model = seed_oss_model()
    model.save_pretrained(tmp_path / "seed")
    save_tokenizer(tokenizer(), tmp_path / "seed", 256)
    config = read_model_config(tmp_path / "seed")
    assert (config.architecture, config.attention_bias, config.o_proj_bias, config.mlp_bias, config.qk_norm,
            config.head_dim) == ("SeedOssForCausalLM", True, True, False, False, 32)
    assert config.num_params() == sum(p.numel() for p in model.parameters())
    runner = ModelRunner(tiny_config(model=config))
    torch.testing.assert_close(paged_logits(runner, PROMPT), logits_of(model), rtol=1e-4, atol=1e-4)


def test_without_its_o_proj_bias_the_seed_oss_logits_would_differ(tmp_path):
    """The parity above depends on the row's attention_out_bias key being read and loaded."""
    model = seed_oss_model()
    model.save_pretrained(tmp_path / "seed")
    runner = ModelRunner(tiny_config(model=read_model_config(tmp_path / "seed")))
    params = hf_parameters(runner.model)
    with torch.no_grad():
        for i in range(COMMON["num_hidden_layers"]):
            params[f"model.layers.{i}.self_attn.o_proj.bias"].zero_()
    assert (paged_logits(runner, PROMPT) - logits_of(model)).abs().max() > 1e-2


def test_a_seed_oss_gguf_file_loads_and_exports_back_to_transformers(tmp_path, monkeypatch):
    llama_cpp_names(monkeypatch)
    path = tmp_path / "seed-oss.gguf"
    held = write_gguf(path, seed_oss_model(), "seed_oss", Q.Q8_0)  # the weights the file holds, dequantized
    names = read_header(path).tensors
    assert "blk.0.post_attention_norm.weight" in names and "blk.0.ffn_norm.weight" not in names

    config = read_gguf_config(path)
    assert (config.architecture, config.attention_bias, config.o_proj_bias, config.head_dim) == \
        ("SeedOssForCausalLM", True, True, 32)
    ours = paged_logits(ModelRunner(tiny_config(model=config)), PROMPT)
    torch.testing.assert_close(ours, logits_of(held), rtol=1e-4, atol=1e-4)  # no q/k permutation undone

    out = export_gguf(tmp_path / "seed-oss-hf", config)
    written = json.loads((out / "config.json").read_text())
    assert (written["architectures"], written["model_type"], written["attention_bias"], written["attention_out_bias"],
            written["mlp_bias"]) == (["SeedOssForCausalLM"], "seed_oss", True, True, False)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(theirs).__name__ == "SeedOssForCausalLM"
    torch.testing.assert_close(logits_of(theirs), ours, rtol=1e-4, atol=1e-4)
    back = read_model_config(out)
    assert dataclasses.replace(back, name="x", checkpoint=None, eos_token_ids=()) == \
        dataclasses.replace(config, name="x", checkpoint=None, quantization=None, eos_token_ids=())
