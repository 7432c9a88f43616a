"""A GGUF file (llama.cpp's and Ollama's model format): its metadata and tensor table, checked before
any weights load, and the ModelConfig they describe.

The header is read by gguf_reader.py under bounds the file sets, then its tensor table is checked
here (known types, bytes inside the file, no overlaps) with the `gguf` package's type tables. It is
parsed once per file and kept: resolving the config, building the tokenizer and loading the weights
all read the same one. The architecture numbers are checked for range and finiteness, and against the
tensors the file holds, before anything (a rotary table, a model on the meta device) is built from
them. Only the header is touched here; tensor data is read tensor by tensor by gguf_weights.py.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import gguf
import numpy as np

from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.errors import BadInput, ConfigError
from batchtop.core_engine.model.families import Flag, ModelFamily, by_gguf_architecture
from batchtop.core_engine.model.gguf_claims import Claims, check_claims
from batchtop.core_engine.model.gguf_header import GGUFHeader, TensorInfo
from batchtop.core_engine.model.gguf_reader import RawHeader, read_gguf_header
from batchtop.core_engine.model.model_numbers import RMS_NORM_EPS, ROPE_THETA, checked_number


def _tensor_infos(path: Path, raw: RawHeader) -> dict[str, TensorInfo]:
    """The tensor table with each type known, each tensor's bytes inside the file and none overlapping
    another, so that no view or read can reach past what is there."""
    tensors: dict[str, TensorInfo] = {}
    for t in raw.tensors:
        if t.name in tensors:
            raise BadInput(f"{path}: tensor {t.name!r} appears twice in the tensor table")
        try:
            kind = gguf.GGMLQuantizationType(t.type_number)
        except ValueError:
            raise BadInput(f"{path}: tensor {t.name!r} has an unknown type number {t.type_number}") from None
        block, type_size = gguf.GGML_QUANT_SIZES[kind]
        shape = tuple(reversed(t.dims))
        if shape[-1] % block:
            raise BadInput(f"{path}: tensor {t.name!r} has rows of {shape[-1]} values, not a whole number of "
                           f"{kind.name} blocks of {block}")
        nbytes = math.prod(shape) * type_size // block
        start = raw.data_start + t.offset
        if start + nbytes > raw.file_size:
            raise BadInput(f"{path}: truncated: tensor {t.name!r} ends at byte {start + nbytes} (the file has "
                           f"{raw.file_size} bytes); download or copy it again")
        tensors[t.name] = TensorInfo(t.name, kind.name, shape, tuple(gguf.quant_shape_to_byte_shape(shape, kind)),
                                     start, nbytes)
    ordered = sorted(tensors.values(), key=lambda info: info.offset)
    for before, after in zip(ordered, ordered[1:]):
        if after.offset < before.offset + before.nbytes:
            raise BadInput(f"{path}: tensor {after.name!r} starts at byte {after.offset}, inside tensor "
                           f"{before.name!r} (bytes {before.offset} to {before.offset + before.nbytes})")
    return tensors


def _parse(path: Path) -> GGUFHeader:
    raw = read_gguf_header(path)
    return GGUFHeader(path, raw.metadata, _tensor_infos(path, raw))


_CACHE: dict[tuple[str, int, int], GGUFHeader] = {}


def read_header(path: str | Path) -> GGUFHeader:
    """The file's header (parsed once per file version); BadInput naming the file for anything wrong."""
    p = Path(path)
    if not p.exists():
        raise BadInput(f"--model {path}: no such file")
    if not p.is_file():
        raise BadInput(f"--model {path}: not a regular file")
    st = p.stat()
    if st.st_size == 0:
        raise BadInput(f"{p}: empty file (0 bytes), not a GGUF model")
    key = (os.path.realpath(p), st.st_size, st.st_mtime_ns)
    if key not in _CACHE:
        _CACHE.clear()  # one model per process: keep at most one header's vocabulary in memory
        _CACHE[key] = _parse(p)
    return _CACHE[key]


def _int(h: GGUFHeader, name: str, default: int | None = None) -> int:
    value = h.key(name)
    if value is None:
        if default is None:
            raise BadInput(f"{h.path}: metadata key {h.architecture}.{name} is missing")
        return default
    if isinstance(value, list):
        raise BadInput(f"{h.path}: {h.architecture}.{name} varies by layer ({value[:4]}...), which batchtop's "
                       "model does not support")
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadInput(f"{h.path}: {h.architecture}.{name} must be an integer, got {value!r}")
    if value < 1:
        raise BadInput(f"{h.path}: {h.architecture}.{name} must be >= 1, got {value}")
    return value


def _float(h: GGUFHeader, name: str, default: float, rule: dict[str, float]) -> float:
    value = h.key(name)
    if value is None:
        return default
    checked_number(value, f"{h.path}: {h.architecture}.{name}", **rule)
    # metadata floats are float32: 1e-05 is stored as 9.99999974e-06; keep the decimal it was written from
    return float(str(np.float32(value))) if isinstance(value, float) else float(value)


def family_of(h: GGUFHeader) -> ModelFamily:
    """The family general.architecture names; BadInput naming it and the supported ones."""
    return by_gguf_architecture(h.architecture, str(h.path))


def _has(h: GGUFHeader, family: ModelFamily, flag: Flag, module: str) -> bool:
    """A flag the family fixes, else whether the file holds layer 0's tensor for it (module's bias)."""
    return flag.default if flag.fixed else f"blk.0.{family.gguf_layer_names()[module]}.bias" in h.tensors


def model_config(h: GGUFHeader, name: str, eos_token_ids: tuple[int, ...]) -> ModelConfig:
    """The ModelConfig the header describes; what batchtop's model cannot run exits 2 naming the key."""
    family = family_of(h)
    embed = h.tensors.get("token_embd.weight")
    if embed is None or len(embed.shape) != 2:
        raise BadInput(f"{h.path}: tensor token_embd.weight is missing (every {h.architecture} file has one)")
    heads = _int(h, "attention.head_count")
    hidden = _int(h, "embedding_length")
    head_dim_key = f"{h.architecture}.attention.key_length"
    if h.key("attention.key_length") is None:
        head_dim_key = f"{h.architecture}.embedding_length / {h.architecture}.attention.head_count"
    head_dim = _int(h, "attention.key_length", max(hidden // heads, 1))
    rotary = _int(h, "rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise BadInput(f"{h.path}: {h.architecture}.rope.dimension_count {rotary} is not the head size {head_dim} "
                       "(partial rotary embeddings are not supported)")
    scaling = h.key("rope.scaling.type")
    if scaling not in (None, "none") or "rope_freqs.weight" in h.tensors:
        what = f"rope.scaling.type {scaling!r}" if scaling not in (None, "none") else "tensor rope_freqs.weight"
        raise BadInput(f"{h.path}: {what}: scaled RoPE (Llama 3.1+, YaRN, linear) is not supported in GGUF "
                       "files yet; export the model from Hugging Face and pass its directory instead")
    claims = Claims(layers=_int(h, "block_count"), hidden=hidden, heads=heads,
                    kv_heads=_int(h, "attention.head_count_kv", heads), head_dim=head_dim, head_dim_key=head_dim_key,
                    ffn=_int(h, "feed_forward_length"))
    check_claims(h, claims)  # before anything is built from these numbers
    try:
        return ModelConfig(
            name=name, vocab_size=embed.shape[0], hidden_size=hidden, intermediate_size=claims.ffn,
            num_hidden_layers=claims.layers, num_attention_heads=heads, num_key_value_heads=claims.kv_heads,
            max_position_embeddings=_int(h, "context_length", 4096),
            rope_theta=_float(h, "rope.freq_base", 10000.0, ROPE_THETA),
            rms_norm_eps=_float(h, "attention.layer_norm_rms_epsilon", 1e-6, RMS_NORM_EPS), head_dim=head_dim,
            attention_bias=_has(h, family, family.qkv_bias, "self_attn.q_proj"),
            o_proj_bias=_has(h, family, family.o_bias, "self_attn.o_proj"),
            mlp_bias=_has(h, family, family.mlp_bias, "mlp.gate_proj"), qk_norm=family.qk_norm,
            tie_word_embeddings="output.weight" not in h.tensors, eos_token_ids=eos_token_ids,
            architecture=family.hf_architecture, checkpoint=str(h.path.resolve()), quantization=h.quantization)
    except ConfigError as exc:
        raise BadInput(f"{h.path}: {exc}") from None
