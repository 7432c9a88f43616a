"""A GGUF file (llama.cpp's and Ollama's model format), read with the `gguf` package: its metadata and
tensor table, checked before any weights load, and the ModelConfig they describe.

The header is parsed once per file (the `gguf` reader takes seconds on a 50k-token vocabulary) and
kept: resolving the config, building the tokenizer and loading the weights all read the same one.
Only the header is touched here; tensor data is read tensor by tensor by gguf_weights.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.errors import BadInput, ConfigError

MAGIC = b"GGUF"
# general.architecture -> the Hugging Face architecture batchtop's model implements it as
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
_BIG_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.scores",
               "tokenizer.ggml.token_type")


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    type_name: str  # GGMLQuantizationType name: F32, F16, Q4_1, Q4_K, ...
    shape: tuple[int, ...]  # PyTorch order (rows first), as Hugging Face stores the tensor
    byte_shape: tuple[int, ...]  # the raw bytes' shape, as gguf.quants.dequantize takes them
    offset: int  # absolute byte offset of the data in the file
    nbytes: int


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    path: Path
    metadata: dict[str, Any]  # every key/value, arrays as lists
    tensors: dict[str, TensorInfo]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def key(self, name: str) -> Any:
        """An architecture key: 'block_count' -> metadata['llama.block_count']."""
        return self.metadata.get(f"{self.architecture}.{name}")

    @property
    def quantization(self) -> str:
        """The file's weight type as llama.cpp names it (Q4_1, Q8_0, F16, ...)."""
        file_type = self.metadata.get("general.file_type")
        try:
            return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_")
        except (ValueError, TypeError):
            kinds = [t.type_name for t in self.tensors.values() if len(t.shape) == 2]
            return max(set(kinds), key=kinds.count) if kinds else "F32"


def _value(field) -> Any:
    value = field.contents()
    return value.tolist() if isinstance(value, np.ndarray) else value


def _parse(path: Path) -> GGUFHeader:
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror or exc})") from None
    if head != MAGIC:
        raise BadInput(f"{path}: not a GGUF file (it starts with {head!r}; a GGUF file starts with {MAGIC!r})")
    size = path.stat().st_size
    try:
        reader = CheckedReader(path)
    except _Truncated as exc:
        raise BadInput(f"{path}: truncated: {exc} (the file has {size} bytes); download or copy it again") from None
    except (ValueError, IndexError, KeyError, TypeError, UnicodeDecodeError, OverflowError, MemoryError) as exc:
        raise BadInput(f"{path}: corrupt or truncated GGUF header ({type(exc).__name__}: {exc}; "
                       f"the file has {size} bytes)") from None
    metadata: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        try:
            metadata[name] = _value(field)
        except (ValueError, IndexError, UnicodeDecodeError) as exc:
            raise BadInput(f"{path}: metadata key {name!r} is unreadable ({exc})") from None
    tensors = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        tensors[t.name] = TensorInfo(t.name, t.tensor_type.name, shape,
                                     tuple(gguf.quant_shape_to_byte_shape(shape, t.tensor_type)),
                                     int(t.data_offset), int(t.n_bytes))
    del reader  # drops the memory map: weights are read later, tensor by tensor
    return GGUFHeader(path, metadata, tensors)


class _Truncated(Exception):
    pass


class CheckedReader(gguf.GGUFReader):
    """gguf's reader, refusing a tensor whose data would run past the end of the file (an interrupted
    download) by name, before the base class builds a view of bytes that are not there."""

    def _build_tensors(self, start_offs, fields):  # noqa: ANN001 (the base class's signature)
        size = len(self.data)
        for field in fields:
            _, name, _, dims, raw_type, offset = field.parts
            label = bytes(name).decode("utf-8", "replace")
            try:
                kind = gguf.GGMLQuantizationType(int(raw_type[0]))
            except ValueError:
                raise ValueError(f"tensor {label!r} has an unknown type number {int(raw_type[0])}") from None
            block, type_size = gguf.GGML_QUANT_SIZES[kind]
            elements = int(np.prod(dims.astype(object))) if len(dims) else 1
            end = start_offs + int(offset[0]) + elements * type_size // block
            if end > size:
                raise _Truncated(f"tensor {label!r} ends at byte {end}")
        super()._build_tensors(start_offs, fields)


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
    return value


def _float(h: GGUFHeader, name: str, default: float) -> float:
    value = h.key(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise BadInput(f"{h.path}: {h.architecture}.{name} must be a number, got {value!r}")
    # metadata floats are float32: 1e-05 is stored as 9.99999974e-06; keep the decimal it was written from
    return float(str(np.float32(value))) if isinstance(value, float) else float(value)


def check_architecture(h: GGUFHeader) -> str:
    arch = ARCHITECTURES.get(h.architecture)
    if arch is None:
        raise BadInput(f"{h.path}: architecture {h.architecture or '(none)'!r} is not supported "
                       f"(supported: {', '.join(ARCHITECTURES)})")
    return arch


def model_config(h: GGUFHeader, name: str, eos_token_ids: tuple[int, ...]) -> ModelConfig:
    """The ModelConfig the header describes; what batchtop's model cannot run exits 2 naming the key."""
    arch = check_architecture(h)
    embed = h.tensors.get("token_embd.weight")
    if embed is None or len(embed.shape) != 2:
        raise BadInput(f"{h.path}: tensor token_embd.weight is missing (every {h.architecture} file has one)")
    heads = _int(h, "attention.head_count")
    hidden = _int(h, "embedding_length")
    head_dim = _int(h, "attention.key_length", hidden // heads if heads else 0)
    rotary = _int(h, "rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise BadInput(f"{h.path}: {h.architecture}.rope.dimension_count {rotary} is not the head size {head_dim} "
                       "(partial rotary embeddings are not supported)")
    scaling = h.key("rope.scaling.type")
    if scaling not in (None, "none") or "rope_freqs.weight" in h.tensors:
        what = f"rope.scaling.type {scaling!r}" if scaling not in (None, "none") else "tensor rope_freqs.weight"
        raise BadInput(f"{h.path}: {what}: scaled RoPE (Llama 3.1+, YaRN, linear) is not supported in GGUF "
                       "files yet; export the model from Hugging Face and pass its directory instead")
    layer = "blk.0."
    bias = f"{layer}attn_q.bias" in h.tensors
    try:
        return ModelConfig(
            name=name, vocab_size=embed.shape[0], hidden_size=hidden,
            intermediate_size=_int(h, "feed_forward_length"), num_hidden_layers=_int(h, "block_count"),
            num_attention_heads=heads, num_key_value_heads=_int(h, "attention.head_count_kv", heads),
            max_position_embeddings=_int(h, "context_length", 4096),
            rope_theta=_float(h, "rope.freq_base", 10000.0),
            rms_norm_eps=_float(h, "attention.layer_norm_rms_epsilon", 1e-6), head_dim=head_dim,
            attention_bias=bias or arch == "Qwen2ForCausalLM",
            o_proj_bias=f"{layer}attn_output.bias" in h.tensors,
            mlp_bias=f"{layer}ffn_gate.bias" in h.tensors, qk_norm=f"{layer}attn_q_norm.weight" in h.tensors,
            tie_word_embeddings="output.weight" not in h.tensors, eos_token_ids=eos_token_ids,
            architecture=arch, checkpoint=str(h.path.resolve()), quantization=h.quantization)
    except ConfigError as exc:
        raise BadInput(f"{h.path}: {exc}") from None
