"""A Hugging Face checkpoint's safetensors, loaded into the model tensor by tensor.

The model is allocated once, empty, on the target device in the target dtype; each tensor is then
read on its own (safe_open) and copied into its place (a fused projection's row slice included), so
peak memory stays near one copy of the weights. Everything the files' headers can tell (names, shapes)
and whether the weights fit is checked before a byte of weights is read, and that check costs what the
files hold, never what config.json claims: its layer count is held against the layers the files have
before anything is built, and one layer built on the meta device stands for all of them.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.device import DTYPES
from batchtop.core_engine.errors import BadInput, ConfigError
from batchtop.core_engine.model.hf_config import read_json
from batchtop.core_engine.model.llama import LlamaForCausalLM
from batchtop.core_engine.model.parameters import empty_model, hf_parameter_shapes, hf_parameters
from batchtop.core_engine.model.weight_bytes import stored_weight_bytes, weights_text
from batchtop.core_engine.proc_info import kib_field

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
GIB = 1 << 30
MIN_PARAM_BYTES = 0.5  # no safetensors dtype is smaller than 4 bits
LAYER_TENSOR = re.compile(r"model\.layers\.(\d+)\.(.+)")


def header_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a safetensors header (no tensor data is read)."""
    try:
        with safe_open(file, framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise BadInput(f"{file}: not a readable safetensors file ({exc})") from None


def tensor_files(model_dir: Path) -> dict[str, Path]:
    """Tensor name -> the file that holds it, from the shard index or the single file's header."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise BadInput(f"{index}: 'weight_map' must map tensor names to file names")
        files = {name: model_dir / file for name, file in weight_map.items()}
        for file in sorted(set(files.values())):
            if not file.is_file():
                raise BadInput(f"{index}: lists {file.name}, which is not in {model_dir}")
        return files
    single = model_dir / SINGLE_FILE
    if single.is_file():
        return dict.fromkeys(header_shapes(single), single)
    raise BadInput(f"--model {model_dir}: no {SINGLE_FILE} or {INDEX_FILE} (only safetensors weights load)")


def _ignorable(name: str, config: ModelConfig) -> bool:
    """Tensors some checkpoints carry that the model does not need: old RoPE caches, a tied lm_head copy."""
    return name.endswith("rotary_emb.inv_freq") or (config.tie_word_embeddings and name == "lm_head.weight")


def layer_shapes(config: ModelConfig) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(the tensors outside the decoder layers, one layer's tensors by their name inside the layer),
    from a one-layer model: every layer of a config has the same tensors."""
    outer: dict[str, tuple[int, ...]] = {}
    layer: dict[str, tuple[int, ...]] = {}
    for name, shape in hf_parameter_shapes(dataclasses.replace(config, num_hidden_layers=1)).items():
        found = LAYER_TENSOR.fullmatch(name)
        if found:
            layer[found.group(2)] = shape
        else:
            outer[name] = shape
    return outer, layer


def _check_claims(config: ModelConfig, files: dict[str, Path]) -> None:
    """config.json's sizes against what the files hold, before anything is built from them: its
    num_hidden_layers against the files' layers, its parameter count against their bytes."""
    layers: dict[int, str] = {}
    for name in files:
        found = LAYER_TENSOR.fullmatch(name)
        if found:
            layers.setdefault(int(found.group(1)), name)
    n = config.num_hidden_layers
    config_json = Path(config.checkpoint) / "config.json"
    beyond = sorted(i for i in layers if i >= n)
    if beyond:
        raise BadInput(f"{files[layers[beyond[0]]]}: unexpected tensor {layers[beyond[0]]}: {config_json} has "
                       f"num_hidden_layers {n}")
    if len(layers) < n:
        gap = next(i for i in range(len(layers) + 1) if i not in layers)
        raise BadInput(f"{config_json}: num_hidden_layers is {n}, but the checkpoint has tensors for {len(layers)} "
                       f"layers (none for model.layers.{gap})")
    size = sum(file.stat().st_size for file in set(files.values()))
    if config.num_params() * MIN_PARAM_BYTES > size:
        raise BadInput(f"{config_json}: describes {config.num_params():,} parameters, more than the {size:,} bytes "
                       f"of its safetensors files hold (see hidden_size, intermediate_size, vocab_size, head_dim)")


def check_checkpoint(config: ModelConfig) -> dict[str, Path]:
    """Every tensor the config needs is in the files with its shape, and nothing unknown is; reads
    only headers. Returns tensor name -> file."""
    model_dir = Path(config.checkpoint)
    files = tensor_files(model_dir)
    _check_claims(config, files)
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(set(files.values())):
        shapes.update(header_shapes(file))
    outer, layer = layer_shapes(config)
    needed = dict(outer)
    for i in range(config.num_hidden_layers):  # as many as the files hold (_check_claims)
        needed.update((f"model.layers.{i}.{rest}", shape) for rest, shape in layer.items())
    for name, shape in needed.items():
        if name not in files:
            raise BadInput(f"--model {model_dir}: tensor {name} is missing (the config needs shape {list(shape)})")
        got = shapes.get(name)
        if got is None:
            raise BadInput(f"{files[name]}: tensor {name} is missing (the shard index says it is here)")
        if got != shape:
            raise BadInput(f"{files[name]}: tensor {name} has shape {list(got)}; config.json needs {list(shape)}")
    unexpected = sorted(n for n in files if n not in needed and not _ignorable(n, config))
    if unexpected:
        raise BadInput(f"{files[unexpected[0]]}: unexpected tensor {unexpected[0]} ({len(unexpected)} in all): "
                       f"not part of a {config.architecture} with this config.json")
    return {name: files[name] for name in needed}


def available_memory(device: str) -> int | None:
    """Bytes free for new tensors: free GPU memory, or MemAvailable on the CPU (None if unknown)."""
    if device == "cuda":
        return torch.cuda.mem_get_info()[0]
    return kib_field("/proc/meminfo", "MemAvailable")


def check_fits(config: ModelConfig, dtype: str, device: str, option: str = "model") -> None:
    need = stored_weight_bytes(config, DTYPES[dtype].itemsize)  # a quantized GGUF's blocks at their own bits
    have = available_memory(device)
    if have is not None and need > have:
        where = "GPU" if device == "cuda" else "machine"
        raise ConfigError(option, f"{config.name}: the weights need {need / GIB:.2f} GiB ({weights_text(config, dtype)}), the {where} "
                                  f"has {have / GIB:.2f} GiB available")


def load_safetensors_model(config: ModelConfig, device: str, dtype: torch.dtype) -> LlamaForCausalLM:
    """The directory's weights in a model allocated once on `device` in `dtype`."""
    files = check_checkpoint(config)
    model = empty_model(config, device, dtype)
    targets = hf_parameters(model)
    read_on = f"cuda:{torch.cuda.current_device()}" if device == "cuda" else "cpu"
    with torch.no_grad():
        for name, file in files.items():
            # One open per tensor: the file is memory-mapped while open, and every page read stays
            # in this process's RSS until it closes (a whole file's worth, with one open per file).
            try:
                with safe_open(file, framework="pt", device=read_on) as f:
                    tensor = f.get_tensor(name)
            except (SafetensorError, OSError, ValueError) as exc:
                raise BadInput(f"{file}: cannot read tensor {name} ({exc})") from None
            targets[name].copy_(tensor)  # converts to the model's dtype in place
            del tensor
    return model
