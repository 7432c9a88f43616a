"""Tiny Hugging Face checkpoints made by transformers itself, with a BPE tokenizer trained on a few sentences.

One per architecture batchtop loads, each exercising what sets it apart: Llama with Llama 3 RoPE
scaling and a tied lm_head, Mistral (plain), Qwen2 with q/k/v biases, Qwen3 with q/k RMSNorm and a
head_dim that is not hidden_size / heads. Weights (norms and biases included) are random, so nothing passes by
being all ones or zeros. Built once per test session.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from batchtop.core_engine.model.export import save_tokenizer, train_byte_level_bpe

SENTENCES = [
    "Continuous batching refills every free slot at the next step.",
    "Static batching waits for the longest request in the group.",
    "The KV cache is paged into blocks of sixteen tokens.",
    "Decode is memory bound: one more sequence is almost free.",
    "Hello, world! Café, naïve, 你好.",
]
KINDS = ("llama", "mistral", "qwen2", "qwen3")
TOKENIZER_VOCAB = 300
MODEL_VOCAB = 320  # larger than the tokenizer's, as Qwen pads its embedding
EOS_ID = 1
COMMON = dict(vocab_size=MODEL_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=EOS_ID)


def hf_config(kind: str):
    import transformers
    if kind == "llama":
        return transformers.LlamaConfig(
            **COMMON, tie_word_embeddings=True,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 32, "rope_theta": 500000.0})
    if kind == "mistral":
        return transformers.MistralConfig(**COMMON, sliding_window=None, tie_word_embeddings=False)
    if kind == "qwen2":
        return transformers.Qwen2Config(**COMMON, tie_word_embeddings=False)
    if kind == "qwen3":
        return transformers.Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=False)
    raise ValueError(kind)


def hf_model(kind: str, seed: int = 0) -> torch.nn.Module:
    import transformers
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(kind), dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn_like(param))
            else:  # scales at which greedy decoding wanders instead of repeating one token
                param.copy_((1.0 if "embed" in name else 0.3) * torch.randn_like(param))
    return model


def tokenizer():
    return train_byte_level_bpe(SENTENCES, TOKENIZER_VOCAB)


def write_checkpoint(kind: str, out: Path, max_shard_size: str | None = None) -> Path:
    """The checkpoint as save_pretrained writes it (sharded when max_shard_size is given)."""
    model = hf_model(kind)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **kwargs)
    save_tokenizer(tokenizer(), out, 256)
    return out


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("hf")
    return {kind: write_checkpoint(kind, root / kind) for kind in KINDS}
