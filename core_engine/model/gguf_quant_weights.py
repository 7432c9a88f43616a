"""A GGUF file's model run quantized: its linears', embedding's and lm_head's blocks kept as the file
stores them (quant_linear.py), everything else dequantized as gguf_weights.py does.

A linear is kept as blocks when every part of it (q, k and v of the fused qkv; gate and up) has a type
batchtop computes from blocks (quant_blocks.BLOCK_TYPES); parts of different types stay apart inside
the one QuantLinear. Anything else (F16/F32 tensors, Q5_K, ..., the norms, the biases) is dequantized to
the run's dtype. Each tensor's bytes are read from the file once. llama.cpp's q/k row order is put back
as for dense rows: for blocks, that is a gather of whole rows.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn

from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.device import DTYPES
from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.model.gguf_file import family_of, read_header
from batchtop.core_engine.model.gguf_header import GGUFHeader, TensorInfo
from batchtop.core_engine.model.gguf_weights import PERMUTED, check_tensors, read_raw, read_tensor, unpermute_rope
from batchtop.core_engine.model.llama import LlamaForCausalLM
from batchtop.core_engine.model.parameters import hf_parameters
from batchtop.core_engine.model.quant_blocks import BLOCK_TYPES, bits_per_weight
from batchtop.core_engine.model.quant_linear import QuantEmbedding, QuantLinear, kernels_expected
from batchtop.core_engine.model.sources import is_gguf

WEIGHTS = ("auto", "quantized", "dequantized")
LINEARS = {  # a layer's fused linear (module, attribute) -> its Hugging Face parts, in output order
    ("self_attn", "qkv_proj"): ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("self_attn", "o_proj"): ("self_attn.o_proj",),
    ("mlp", "gate_up_proj"): ("mlp.gate_proj", "mlp.up_proj"),
    ("mlp", "down_proj"): ("mlp.down_proj",),
}
EMBEDDING, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"


def kept_as_blocks(infos: list[TensorInfo]) -> bool:
    return all(info.type_name in BLOCK_TYPES for info in infos)


def layer_parts(config: ModelConfig, infos: dict[str, TensorInfo]):
    """(layer index, (module, attribute), its parts' HF names, whether it is kept as blocks), every linear."""
    for i in range(config.num_hidden_layers):
        for where, parts in LINEARS.items():
            names = [f"model.layers.{i}.{part}.weight" for part in parts]
            yield i, where, names, kept_as_blocks([infos[n] for n in names])


def weight_bits(config: ModelConfig, infos: dict[str, TensorInfo], element_bytes: int) -> tuple[float, float, float]:
    """Stored bits per weight when the file runs quantized: (the layers' linears on average, weighted by
    their sizes; the embedding; the lm_head). What is dequantized counts the dtype's bits."""
    dense = 8.0 * element_bytes

    def bits(info: TensorInfo, kept: bool) -> float:
        return bits_per_weight(info.type_name) if kept else dense

    weights = total = 0.0
    for _, _, names, kept in layer_parts(config, infos):
        for name in names:
            n = float(np.prod(infos[name].shape))
            weights, total = weights + n, total + n * bits(infos[name], kept)
    embed = infos[EMBEDDING]
    embed_bits = bits(embed, kept_as_blocks([embed]))
    head_bits = embed_bits if config.tie_word_embeddings else bits(infos[LM_HEAD], kept_as_blocks([infos[LM_HEAD]]))
    return total / weights, embed_bits, head_bits


def kernels_compute_blocks(device: str, dtype: str) -> bool:
    """Whether batchtop's block kernels can compute a quantized run's linears here: the CPU, bfloat16 or
    float32 activations, the C++ kernels loaded or still to be built."""
    return device == "cpu" and dtype in ("bfloat16", "float32") and kernels_expected()


def slow_blocks_note(config: ModelConfig, device: str, dtype: str) -> str | None:
    """For a run asked to stay quantized where the kernels cannot compute its blocks: what that costs."""
    if config.weights != "quantized" or kernels_compute_blocks(device, dtype):
        return None
    return (f"--weights quantized on {device} in {dtype}: batchtop's block kernels need the CPU in bfloat16 or "
            "float32 (and a C++ compiler), so every step dequantizes the blocks in torch, tens of times slower than "
            "--weights dequantized (which holds the weights expanded instead)")


def with_weights(config: ModelConfig, choice: str, device: str, dtype: str) -> ModelConfig:
    """The model config with how its weights run (--weights): auto is quantized for a GGUF file on the CPU
    in bfloat16 where batchtop's block kernels can run; dequantized elsewhere: CUDA or no kernels, where every
    step would dequantize the blocks in torch (tens of times slower), and float32, whose exact math the
    kernels' int8 activations would round (--weights quantized asks for them). A model without blocks
    (a preset, safetensors) cannot run quantized."""
    if choice not in WEIGHTS:
        raise ConfigError("weights", f"must be one of {', '.join(WEIGHTS)}, got {choice!r}")
    if config.checkpoint is None or not is_gguf(config.checkpoint):
        if choice == "quantized":
            what = "random weights" if config.checkpoint is None else "a safetensors checkpoint"
            raise ConfigError("weights", f"quantized keeps a GGUF file's quantized blocks; {config.name} is "
                                         f"{what}, which has none (use a .gguf --model, or --weights auto)")
        return dataclasses.replace(config, weights=None, weight_bits=None)
    if choice == "auto":
        # float32 on the kernels rounds activations to int8 blocks: --dtype float32 alone keeps the exact math
        choice = "quantized" if dtype == "bfloat16" and kernels_compute_blocks(device, dtype) else "dequantized"
    if choice == "dequantized":
        return dataclasses.replace(config, weights="dequantized", weight_bits=None)
    bits = weight_bits(config, check_tensors(config), DTYPES[dtype].itemsize)
    return dataclasses.replace(config, weights="quantized", weight_bits=bits)


def read_blocks(h: GGUFHeader, info: TensorInfo) -> torch.Tensor:
    """One tensor's bytes as the file stores them: uint8 (rows, row_bytes)."""
    return torch.from_numpy(read_raw(h, info)).reshape(info.shape[0], -1)


def _rope_heads(config: ModelConfig, name: str) -> int | None:
    """The head count llama.cpp's q/k row order is undone with, for a tensor it reordered; else None."""
    module = name.rsplit(".", 1)[0].split(".", 3)[-1]  # self_attn.q_proj
    if module not in PERMUTED:
        return None
    return config.num_attention_heads if module.endswith("q_proj") else config.num_key_value_heads


def _merged(parts: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """Adjacent parts of one type as one block matrix (rows concatenated)."""
    out: list[tuple[str, list[torch.Tensor]]] = []
    for kind, blocks in parts:
        if out and out[-1][0] == kind:
            out[-1][1].append(blocks)
        else:
            out.append((kind, [blocks]))
    return [(kind, torch.cat(rows) if len(rows) > 1 else rows[0]) for kind, rows in out]


def _materialize(model: nn.Module, device: str, dtype: torch.dtype) -> None:
    """Every parameter still on the meta device allocated, uninitialised, on `device` in `dtype`."""
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if param.is_meta:
                setattr(module, name, nn.Parameter(torch.empty(param.shape, dtype=dtype, device=device),
                                                   requires_grad=param.requires_grad))


def load_gguf_quantized(config: ModelConfig, device: str, dtype: torch.dtype) -> LlamaForCausalLM:
    """The file's model with its quantized linears, embedding and lm_head kept as blocks on `device`; the
    rest dequantized to `dtype`."""
    h = read_header(config.checkpoint)
    infos = check_tensors(config, h)
    permute = family_of(h).gguf_permuted_qk
    read: set[str] = set()

    def blocks_of(name: str) -> torch.Tensor:
        blocks = read_blocks(h, infos[name])
        heads = _rope_heads(config, name) if permute else None
        if heads is not None:
            blocks = unpermute_rope(blocks, heads).contiguous()
        read.add(name)
        return blocks.to(device)

    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    for i, (module, attr), names, kept in layer_parts(config, infos):
        if kept:
            owner = getattr(model.model.layers[i], module)
            dense = getattr(owner, attr)
            parts = _merged([(infos[n].type_name, blocks_of(n)) for n in names])
            setattr(owner, attr, QuantLinear(dense.in_features, parts, dense.bias, halves=attr == "gate_up_proj"))
    h_size, embed = config.hidden_size, infos[EMBEDDING]
    if kept_as_blocks([embed]):
        table = nn.Parameter(blocks_of(EMBEDDING), requires_grad=False)
        model.model.embed_tokens = QuantEmbedding(table, embed.type_name, h_size, dtype)
        if config.tie_word_embeddings:
            model.lm_head = QuantLinear(h_size, [(embed.type_name, table)])  # the same blocks: one copy
    if not config.tie_word_embeddings and kept_as_blocks([infos[LM_HEAD]]):
        model.lm_head = QuantLinear(h_size, [(infos[LM_HEAD].type_name, blocks_of(LM_HEAD))])
    _materialize(model, device, dtype)
    if config.tie_word_embeddings and not isinstance(model.lm_head, QuantLinear):
        model.tie_weights()  # a dense embedding: the lm_head reads its matrix
    targets = hf_parameters(model)
    with torch.no_grad():
        for name, info in infos.items():
            if name in read:
                continue
            tensor = read_tensor(h, info)
            heads = _rope_heads(config, name) if permute else None
            targets[name].copy_(tensor if heads is None else unpermute_rope(tensor, heads))
            del tensor
    return model.eval()
