"""A model's parameters as tensors: allocated once on the device (from the meta device, uninitialised),
named as Hugging Face names them (a fused projection's parts as row views), or the presets'
deterministic random weights."""

from __future__ import annotations

import torch
from torch import nn

from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.model.llama import LlamaForCausalLM


def init_weights(model: LlamaForCausalLM, seed: int, std: float = 0.02) -> None:
    """Deterministic random weights with HF's initializer_range; drawn on the weights' device."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen, device=device) * std)


def hf_parameter_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """What the config needs, under Hugging Face's names (built on the meta device: no memory)."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return {name: tuple(t.shape) for name, t in hf_parameters(model).items()}


def hf_parameters(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """Every parameter under its Hugging Face name; a fused projection's parts are row views of it,
    so writing into a view writes the model's weight. A tied lm_head appears once, as the embedding."""
    out: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        owner_path, _, rest = name.rpartition(".")  # e.g. "model.layers.0.self_attn.qkv_proj", "weight"
        module_path, _, linear = owner_path.rpartition(".")
        parts = getattr(model.get_submodule(module_path), "fused_parts", {}).get(linear) if module_path else None
        if parts is None:
            out[name] = param
            continue
        for (part, _), piece in zip(parts, param.split([n for _, n in parts])):
            out[f"{module_path}.{part}.{rest}"] = piece
    return out


def empty_model(config: ModelConfig, device: str, dtype: torch.dtype) -> LlamaForCausalLM:
    """The model with uninitialised weights allocated once, straight on the device, in the dtype."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    # each meta parameter replaced by hand: Module.to_empty's empty_like on meta tensors imports sympy
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            setattr(module, name, nn.Parameter(torch.empty(param.shape, dtype=dtype, device=device),
                                               requires_grad=param.requires_grad))
    model.tie_weights()  # each module got its own new tensor
    return model.eval()


def build_model(config: ModelConfig, device: str, dtype: torch.dtype, seed: int) -> LlamaForCausalLM:
    """The preset's deterministic random weights."""
    model = empty_model(config, device, dtype)
    init_weights(model, seed)
    return model
