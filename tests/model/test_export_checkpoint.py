"""`batchtop export-checkpoint`: the directory holds exactly the preset's weights, for transformers and for
`--model DIR` alike, and it never writes over anything."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from batchtop.core_engine.config import preset
from batchtop.core_engine.worker.model_runner import ModelRunner
from batchtop.core_engine.model.checkpoint import INDEX_FILE
from batchtop.core_engine.model.export import export_checkpoint, train_byte_level_bpe
from batchtop.core_engine.model.hf_config import read_model_config
from batchtop.core_engine.model.tokenizer import Tokenizer
from batchtop.tui.cli import main
from tests.conftest import tiny_config
from tests.model.test_checkpoint_parity import PROMPT, paged_logits

transformers = pytest.importorskip("transformers")


def export(out_dir, *args):
    return CliRunner().invoke(main, ["export-checkpoint", str(out_dir), "--model", "tiny", *args])


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


def test_transformers_and_model_dir_run_the_presets_weights(tmp_path):
    out = tmp_path / "tiny-export"
    result = export(out, "--seed", "3")
    assert result.exit_code == 0, result.output
    ours = ModelRunner(tiny_config(seed=3))
    loaded = ModelRunner(tiny_config(model=read_model_config(out)))
    assert_same_weights(loaded.model, ours.model)
    assert loaded.config.model.num_params() == ours.config.model.num_params()

    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(torch.tensor([PROMPT])).logits[0]
    torch.testing.assert_close(paged_logits(ours, PROMPT), want, rtol=1e-4, atol=1e-4)


def test_a_bfloat16_export_is_the_engines_bfloat16_model(tmp_path):
    out = export_checkpoint(tmp_path / "bf16", preset("tiny"), seed=0, dtype="bfloat16")
    loaded = ModelRunner(tiny_config(model=read_model_config(out), dtype="bfloat16"))
    assert_same_weights(loaded.model, ModelRunner(tiny_config(dtype="bfloat16")).model)


def test_a_sharded_export_loads_the_same(tmp_path):
    out = export_checkpoint(tmp_path / "sharded", preset("tiny"), seed=0, shard_bytes=100_000)
    index = json.loads((out / INDEX_FILE).read_text())
    assert len(set(index["weight_map"].values())) > 3
    assert_same_weights(ModelRunner(tiny_config(model=read_model_config(out))).model, ModelRunner(tiny_config()).model)


def test_the_tokenizer_covers_the_models_vocabulary_and_marks_eos(tmp_path):
    out = export_checkpoint(tmp_path / "tok", preset("tiny"), seed=0)
    tok = Tokenizer.from_dir(out)
    assert tok.vocab_size == preset("tiny").vocab_size and tok.eos_token_ids == (1,)
    text = "Continuous batching refills free slots."
    assert tok.decode(tok.encode(text)) == text and tok.encode(text)[0] == 0  # BOS first
    assert len(tok.encode(text)) < len(text.encode()) / 2  # merges learned: not one token per byte
    big = train_byte_level_bpe(["a few words", "and a few more"], preset("cpu-demo").vocab_size)
    assert big.get_vocab_size() == 32000 and big.id_to_token(31999) is not None  # reserved ids fill it


def test_an_existing_directory_with_files_is_never_written(tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = export(out)
    assert result.exit_code == 2 and "exists and is not an empty directory" in result.output
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]  # no partial directory left behind


def test_an_empty_directory_is_filled(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    assert export(out).exit_code == 0
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} == {p.name for p in out.iterdir()}
