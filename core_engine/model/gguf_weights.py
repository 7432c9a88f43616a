"""A GGUF file's tensors under Hugging Face's names, checked, then dequantized into the model one by one.

As with safetensors (checkpoint.py), the model is allocated once, empty, in the run's dtype, and each
tensor is read from the file on its own, dequantized by the `gguf` package (float32, one tensor at a
time) and copied into its place: peak memory stays near one copy of the weights plus one tensor.
llama.cpp's converter reorders the rows of a Llama q/k projection for its RoPE layout; they are put
back here, so the weights equal the Hugging Face checkpoint's. Names and that reordering follow the
file's family (families.py).
"""

from __future__ import annotations

import gguf
import numpy as np
import torch

from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.model import families
from batchtop.core_engine.model.checkpoint import layer_shapes
from batchtop.core_engine.model.families import ModelFamily
from batchtop.core_engine.model.gguf_file import family_of, read_header
from batchtop.core_engine.model.gguf_finite import FLOATS, SCALES, check_finite, check_finite_values
from batchtop.core_engine.model.gguf_header import GGUFHeader, TensorInfo
from batchtop.core_engine.model.llama import LlamaForCausalLM
from batchtop.core_engine.model.parameters import empty_model, hf_parameters

# What gguf.quants dequantizes and batchtop accepts: the float types, the legacy block quants, the K-quants.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K")
# llama.cpp's name -> Hugging Face's, outside the layers (every family)
TOP_LEVEL = {g: hf for hf, g in families.GGUF_TOP_LEVEL.items()}
PERMUTED = families.ROPE_PERMUTED  # in a file whose family says llama.cpp permuted them


def layer_names(family: ModelFamily | None = None) -> dict[str, str]:
    """llama.cpp's name of a module inside a layer -> Hugging Face's, in `family`'s files (None: any
    family's name is known)."""
    rows = families.FAMILIES if family is None else (family,)
    return {g: module for f in rows for module, g in f.gguf_layer_names().items()}


def hf_name(gguf_name: str, family: ModelFamily | None = None) -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'; None for a name we do not know."""
    return _hf_name(gguf_name, layer_names(family))


def _hf_name(gguf_name: str, layer: dict[str, str]) -> str | None:
    if gguf_name in TOP_LEVEL:
        return TOP_LEVEL[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in layer \
            and parts[3] in ("weight", "bias"):
        return f"model.layers.{parts[1]}.{layer[parts[2]]}.{parts[3]}"
    return None


def check_tensors(config: ModelConfig, header: GGUFHeader | None = None) -> dict[str, TensorInfo]:
    """Every tensor the config needs is in the file with its shape and a type we dequantize, and
    nothing unknown is; reads only the header. Returns HF name -> the file's tensor."""
    h = header if header is not None else read_header(config.checkpoint)
    family = family_of(h)
    layer = layer_names(family)
    by_hf: dict[str, TensorInfo] = {}
    for info in h.tensors.values():
        name = _hf_name(info.name, layer)
        if name is None:
            raise BadInput(f"{h.path}: unexpected tensor {info.name} (not part of a {h.architecture} model "
                           "batchtop runs)")
        by_hf[name] = info
    needed = _needed_shapes(config)
    for name, shape in needed.items():
        info = by_hf.get(name)
        if info is None:
            raise BadInput(f"{h.path}: tensor {gguf_name_of(name, family)} is missing (the metadata needs shape "
                           f"{list(shape)})")
        if info.shape != shape:
            raise BadInput(f"{h.path}: tensor {info.name} has shape {list(info.shape)}; the metadata needs "
                           f"{list(shape)}")
        if info.type_name not in SUPPORTED_TYPES:
            raise BadInput(f"{h.path}: tensor {info.name} has type {info.type_name}, which batchtop cannot "
                           f"dequantize (supported: {', '.join(SUPPORTED_TYPES)})")
    extra = sorted(n for n in by_hf if n not in needed and not (n == "lm_head.weight" and config.tie_word_embeddings))
    if extra:
        raise BadInput(f"{h.path}: unexpected tensor {by_hf[extra[0]].name} ({len(extra)} in all) for this metadata")
    return {name: by_hf[name] for name in needed}


def _needed_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """What the config needs, from one layer built on the meta device (every layer has the same
    tensors): the cost is the file's layer count (held against its tensors already), not a model's."""
    outer, layer = layer_shapes(config)
    needed = dict(outer)
    for i in range(config.num_hidden_layers):
        needed.update((f"model.layers.{i}.{rest}", shape) for rest, shape in layer.items())
    return needed


def gguf_name_of(hf: str, family: ModelFamily | None = None) -> str:
    """The name llama.cpp gives Hugging Face's tensor `hf` in `family`'s files (None: Llama's)."""
    if hf in families.GGUF_TOP_LEVEL:
        return families.GGUF_TOP_LEVEL[hf]
    _, _, layer, *rest = hf.split(".")
    module, kind = ".".join(rest[:-1]), rest[-1]
    short = (families.GGUF_LAYER if family is None else family.gguf_layer_names()).get(module, module)
    return f"blk.{layer}.{short}.{kind}"


def unpermute_rope(rows: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order: within each head it interleaves the two rotary halves
    (rows 0, d/2, 1, d/2+1, ...); Hugging Face keeps the halves apart."""
    head = rows.shape[0] // num_heads
    return rows.reshape(num_heads, head // 2, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


def read_raw(h: GGUFHeader, info: TensorInfo) -> np.ndarray:
    """One tensor's bytes as the file stores them (a fresh uint8 array, not a view of the file), its
    block scales (or float values) checked finite: both ways of running a file read through here."""
    try:
        raw = np.fromfile(h.path, dtype=np.uint8, count=info.nbytes, offset=info.offset)
    except OSError as exc:
        raise BadInput(f"{h.path}: cannot read tensor {info.name} ({exc.strerror or exc})") from None
    if raw.size != info.nbytes:
        raise BadInput(f"{h.path}: truncated: tensor {info.name} has {raw.size} of its {info.nbytes} bytes")
    check_finite(h, info, raw)
    return raw


def read_tensor(h: GGUFHeader, info: TensorInfo) -> torch.Tensor:
    """One tensor from the file, dequantized to float32 (a fresh array, not a view of the file)."""
    raw = read_raw(h, info)
    kind = gguf.GGMLQuantizationType[info.type_name]
    values = gguf.quants.dequantize(raw.reshape(info.byte_shape), kind)
    if info.type_name not in SCALES and info.type_name not in FLOATS:  # BF16: its values are its numbers
        check_finite_values(h, info, values)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32).reshape(info.shape))


def load_gguf_model(config: ModelConfig, device: str, dtype: torch.dtype) -> LlamaForCausalLM:
    """The file's weights, dequantized to `dtype`, in a model allocated once on `device`."""
    h = read_header(config.checkpoint)
    infos = check_tensors(config, h)
    model = empty_model(config, device, dtype)
    targets = hf_parameters(model)
    permute = family_of(h).gguf_permuted_qk
    with torch.no_grad():
        for name, info in infos.items():
            tensor = read_tensor(h, info)
            module = name.rsplit(".", 1)[0].split(".", 3)[-1]  # self_attn.q_proj
            if permute and module in PERMUTED:
                heads = config.num_attention_heads if module.endswith("q_proj") else config.num_key_value_heads
                tensor = unpermute_rope(tensor, heads)
            targets[name].copy_(tensor)
            del tensor
    return model
