"""Our Llama and Hugging Face's LlamaForCausalLM, loaded with the same weights, give the same logits."""

from __future__ import annotations

import pytest
import torch

from batchtop.core_engine.config import preset
from batchtop.core_engine.sched.kv_cache import BlockAllocator, BlockManager
from batchtop.core_engine.sched.request import Request, Sequence
from batchtop.core_engine.worker.model_runner import ModelRunner
from batchtop.core_engine.sched import SchedulerOutput
from tests.conftest import tiny_config

transformers = pytest.importorskip("transformers")

PROMPT = [3, 141, 59, 26, 5, 358, 97, 93, 238, 46, 264, 33, 83, 279, 50, 288, 41, 97, 169]


def hf_model(state_dict: dict) -> torch.nn.Module:
    m = preset("tiny")
    config = transformers.LlamaConfig(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_hidden_layers, num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_key_value_heads, max_position_embeddings=m.max_position_embeddings,
        rope_theta=m.rope_theta, rms_norm_eps=m.rms_norm_eps, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False)
    model = transformers.LlamaForCausalLM(config).eval()
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return model


def our_logits(runner: ModelRunner, manager: BlockManager, seq: Sequence, start: int, n: int) -> torch.Tensor:
    """Logits of every fed row for tokens [start, start+n) of seq, through the paged path."""
    manager.grow(seq, start + n)
    batch = runner.prepare(SchedulerOutput(scheduled=[(seq, n)]))
    batch.logits_rows = torch.arange(n)
    logits = runner.model(batch.input_ids, batch.positions, batch.attention, batch.logits_rows)
    seq.num_computed_tokens += n
    return logits


def test_same_weights_give_the_same_logits_for_prefill_chunks_and_decode():
    config = tiny_config(block_size=4)
    runner = ModelRunner(config)
    hf = hf_model(runner.model.state_dict())
    with torch.no_grad():
        want = hf(torch.tensor([PROMPT])).logits[0].float()

    manager = BlockManager(BlockAllocator(config.num_kv_blocks, config.block_size))
    seq = Sequence(Request("p", tuple(PROMPT[:17]), 4), index=0, arrival_s=0.0)
    rows = [our_logits(runner, manager, seq, 0, 7),  # first chunk: fresh K/V
            our_logits(runner, manager, seq, 7, 10)]  # second chunk: reads the paged cache
    for token in PROMPT[17:]:  # feed the rest as if sampled: one-token rows take the decode path
        seq.token_ids.append(token)
        assert not seq.is_prefill
        rows.append(our_logits(runner, manager, seq, seq.num_computed_tokens, 1))
    got = torch.cat(rows)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_state_dict_round_trips_through_hugging_face_names():
    runner = ModelRunner(tiny_config())
    sd = runner.model.state_dict()
    assert "model.layers.0.self_attn.q_proj.weight" in sd and "model.layers.1.mlp.up_proj.weight" in sd
    hf = hf_model(sd)
    assert set(hf.state_dict()) - {k for k in hf.state_dict() if "rotary" in k} == set(sd)
    other = ModelRunner(tiny_config(seed=1)).model
    other.load_state_dict(hf.state_dict(), strict=False)
    for name, tensor in runner.model.state_dict().items():
        assert torch.equal(other.state_dict()[name], tensor), name
