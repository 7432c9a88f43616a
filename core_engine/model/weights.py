"""A model's weights, wherever they come from: a GGUF file (kept quantized or dequantized, as the config
says) or a Hugging Face safetensors directory."""

from __future__ import annotations

import torch

from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.model.checkpoint import load_safetensors_model
from batchtop.core_engine.model.gguf_quant_weights import load_gguf_quantized
from batchtop.core_engine.model.gguf_weights import load_gguf_model
from batchtop.core_engine.model.llama import LlamaForCausalLM
from batchtop.core_engine.model.sources import is_gguf


def load_model(config: ModelConfig, device: str, dtype: torch.dtype) -> LlamaForCausalLM:
    """The checkpoint's weights in a model allocated once on `device` in `dtype`, tensor by tensor."""
    if not is_gguf(config.checkpoint):
        load = load_safetensors_model
    else:
        load = load_gguf_quantized if config.weights == "quantized" else load_gguf_model
    return load(config, device, dtype)
