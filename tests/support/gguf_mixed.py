"""Tiny GGUF files whose tensors mix block types the way a llama.cpp Q4_K_M file does (Q4_K linears, Q6_K
in some v/down, a Q8_0 embedding, Q4_1 elsewhere), written with gguf_files.write_gguf.

The `gguf` package quantizes only the legacy types, so a K-quant tensor here is random block bytes whose
fp16 scales are set to small values: a valid tensor of that type, whatever the source weights were.
write_gguf hands back the transformers model with each tensor replaced by what the file holds, so
batchtop's logits can still be compared to transformers'.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from unittest import mock

import gguf
import numpy as np
import torch

from tests.support import gguf_files
from tests.support.gguf_files import Q
from tests.support.hf_checkpoints import COMMON

SCALE_AT = {Q.Q4_K: ((0, 2e-4), (2, 1e-4)), Q.Q6_K: ((208, 2e-5),)}  # byte offset of an fp16 scale, its size
_quantize = gguf.quants.quantize


def random_blocks(data: np.ndarray, kind: Q, seed: int = 0) -> np.ndarray:
    """Random `kind` blocks for a tensor of data's shape: uint8 (rows, row_bytes)."""
    size, nbytes = gguf.GGML_QUANT_SIZES[kind]
    rows, k = data.shape
    rng = np.random.default_rng(seed + rows * 7919 + k)
    raw = rng.integers(0, 256, (rows, k // size, nbytes), dtype=np.uint8)
    for offset, scale in SCALE_AT[kind]:
        halves = rng.uniform(0.5, 1.5, (rows, k // size, 1)) * scale
        raw[..., offset:offset + 2] = halves.astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def _quantize_any(data: np.ndarray, kind: Q) -> np.ndarray:
    return random_blocks(data, kind) if kind in SCALE_AT else _quantize(data, kind)


def llama(hidden: int = 256, intermediate: int = 256, tied: bool = True, seed: int = 0) -> torch.nn.Module:
    """A 2-layer Llama whose widths are whole K-quant blocks (256 weights)."""
    import transformers
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**{**COMMON, "hidden_size": hidden, "intermediate_size": intermediate},
                                      tie_word_embeddings=tied, rope_theta=10000.0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(0.05 * torch.randn_like(param) + (1.0 if name.endswith("norm.weight") else 0.0))
    return model


def q4_k_m(name: str, quant: Q) -> Q:
    """Q4_K_M-like: Q4_K linears, Q6_K for v and down, Q8_0 for the embedding."""
    if name.endswith("norm.weight") or name.endswith(".bias"):
        return Q.F32
    if name == "model.embed_tokens.weight":
        return Q.Q8_0
    return Q.Q6_K if (".v_proj." in name or ".down_proj." in name) else Q.Q4_K


def write_mixed_gguf(path: Path, model: torch.nn.Module, types: Callable[[str, Q], Q] = q4_k_m) -> torch.nn.Module:
    """`model` written as a llama GGUF file with types(hf_name, _) for each tensor; returns it holding the
    file's weights."""
    with mock.patch.object(gguf_files, "weight_type", types), mock.patch.object(gguf.quants, "quantize", _quantize_any):
        return gguf_files.write_gguf(path, model, "llama", Q.Q8_0)
