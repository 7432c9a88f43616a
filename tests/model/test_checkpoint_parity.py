"""Hugging Face checkpoints (Llama with Llama 3 RoPE scaling, Mistral, Qwen2, Qwen3) loaded by batchtop
compute what transformers computes on the same files: the same logits, the same greedy tokens."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.kv_cache import BlockAllocator, BlockManager
from batchtop.core_engine.sched.request import Request, SamplingParams, Sequence
from batchtop.core_engine.worker.model_runner import ModelRunner
from batchtop.core_engine.model.checkpoint import INDEX_FILE
from batchtop.core_engine.model.hf_config import read_model_config
from tests.conftest import run_all, tiny_config
from tests.support.hf_checkpoints import KINDS, SENTENCES, hf_model, write_checkpoint
from tests.model.test_model_parity import our_logits

pytest.importorskip("transformers")

PROMPT = list(range(3, 63, 2))  # 30 tokens: a 7-token chunk, a 13-token chunk, then 10 decodes


def engine_config(model_dir, **overrides):
    return tiny_config(model=read_model_config(model_dir), **overrides)


def paged_logits(runner: ModelRunner, prompt: list[int]) -> torch.Tensor:
    config = runner.config
    manager = BlockManager(BlockAllocator(config.num_kv_blocks, config.block_size))
    seq = Sequence(Request("p", tuple(prompt[:20]), 4), index=0, arrival_s=0.0)
    rows = [our_logits(runner, manager, seq, 0, 7), our_logits(runner, manager, seq, 7, 13)]
    for token in prompt[20:]:
        seq.token_ids.append(token)
        rows.append(our_logits(runner, manager, seq, seq.num_computed_tokens, 1))
    return torch.cat(rows)


def hf_logits(kind: str, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(kind)(torch.tensor([prompt])).logits[0]


@pytest.mark.parametrize("kind", KINDS)
def test_logits_match_transformers_through_prefill_chunks_and_decode(hf_checkpoints, kind):
    got = paged_logits(ModelRunner(engine_config(hf_checkpoints[kind])), PROMPT)
    want = hf_logits(kind, PROMPT)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_without_llama3_rope_scaling_the_llama_checkpoint_would_not_match(hf_checkpoints):
    """The parity above depends on the scaling: the test checkpoint's positions reach the scaled band."""
    config = engine_config(hf_checkpoints["llama"])
    unscaled = config.with_(model=dataclasses.replace(config.model, rope_scaling=None))
    got = paged_logits(ModelRunner(unscaled), PROMPT)
    assert (got - hf_logits("llama", PROMPT)).abs().max() > 1e-2


def hf_greedy(kind: str, prompt: tuple[int, ...], n: int) -> tuple[int, ...]:
    """Greedy decoding by full forwards in transformers: no cache, no generation config involved."""
    model = hf_model(kind)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return tuple(ids[len(prompt):])


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_generations_match_transformers_token_for_token(hf_checkpoints, kind):
    from batchtop.core_engine.model.tokenizer import Tokenizer
    tok = Tokenizer.from_dir(hf_checkpoints[kind])
    requests = [Request(f"r{i}", tuple(tok.encode(text)), 12, sampling=SamplingParams(ignore_eos=True))
                for i, text in enumerate(SENTENCES[:3])]
    engine = Engine(engine_config(hf_checkpoints[kind], max_num_batched_tokens=16))  # prompts go in chunks
    outputs, _, _ = run_all(engine, requests)
    for r in requests:
        assert outputs[r.id] == hf_greedy(kind, r.prompt_token_ids, 12), r.id
        assert len(set(outputs[r.id])) > 3  # a model stuck on one token would prove little


def test_sharded_and_single_file_checkpoints_load_the_same(hf_checkpoints, tmp_path):
    sharded = write_checkpoint("qwen2", tmp_path / "sharded", max_shard_size="40KB")
    assert (sharded / INDEX_FILE).is_file() and len(list(sharded.glob("*.safetensors"))) > 2
    one = ModelRunner(engine_config(hf_checkpoints["qwen2"])).model.state_dict()
    many = ModelRunner(engine_config(sharded)).model.state_dict()
    assert one.keys() == many.keys()
    for name, tensor in one.items():
        assert torch.equal(many[name], tensor), name


@pytest.mark.parametrize("kind", KINDS)
def test_parameter_count_is_what_transformers_holds(hf_checkpoints, kind):
    """The roofline and Device panels use num_params(): head_dim, biases, q/k norms and tying included."""
    want = sum(p.numel() for p in hf_model(kind).parameters())  # a tied matrix counts once
    assert read_model_config(hf_checkpoints[kind]).num_params() == want


def test_hub_style_rope_config_reads_like_transformers_5_style(hf_checkpoints, tmp_path):
    """Checkpoints on the Hub write rope_theta + rope_scaling {"type": ...}; transformers 5 writes rope_parameters."""
    hub = shutil.copytree(hf_checkpoints["llama"], tmp_path / "llama")
    config = json.loads((hub / "config.json").read_text())
    rope = config.pop("rope_parameters")
    theta, kind = rope.pop("rope_theta"), rope.pop("rope_type")
    (hub / "config.json").write_text(json.dumps({**config, "rope_theta": theta, "rope_scaling": {"type": kind, **rope}}))
    ours, theirs = read_model_config(hub), read_model_config(hf_checkpoints["llama"])
    assert ours.rope_scaling is not None and ours.rope_theta == 500000.0
    assert dataclasses.replace(ours, name="x", checkpoint=None) == dataclasses.replace(theirs, name="x", checkpoint=None)


def test_a_sliding_window_caps_the_model_length_so_full_attention_stays_exact(hf_checkpoints, tmp_path):
    mistral = shutil.copytree(hf_checkpoints["mistral"], tmp_path / "mistral")
    config = json.loads((mistral / "config.json").read_text())
    (mistral / "config.json").write_text(json.dumps({**config, "sliding_window": 128}))
    assert read_model_config(mistral).max_position_embeddings == 128 < config["max_position_embeddings"]
