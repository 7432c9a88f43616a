"""A GGUF file's architecture numbers held against the tensors it holds, before anything is built from
them. A model directory's config.json is held against its safetensors the same way (checkpoint.py).

What this stops (issue 41): a block_count of 10^6 in a two-layer file (10^6 layers built on the meta
device to learn the shapes), a key_length of 2^31 (a rotary table of gigabytes built before any shape
was compared), an embedding_length of 2^31 (a meta tensor past what torch can size). Each number is
compared with the one tensor that states it, so the message names the key and the tensor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.model.gguf_header import GGUFHeader

LAYER_TENSOR = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True, slots=True)
class Claims:
    """The numbers as the metadata gives them; head_dim_key names where head_dim came from."""
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    head_dim_key: str
    ffn: int


def check_layers(h: GGUFHeader, layers: int) -> None:
    """block_count against the blk.N tensors: none beyond it, none of its layers without tensors."""
    found: dict[int, str] = {}
    for name in h.tensors:
        match = LAYER_TENSOR.match(name)
        if match:
            found.setdefault(int(match.group(1)), name)
    beyond = sorted(i for i in found if i >= layers)
    if beyond:
        raise BadInput(f"{h.path}: unexpected tensor {found[beyond[0]]}: {h.architecture}.block_count is {layers:,}")
    if len(found) < layers:
        gap = next(i for i in range(len(found) + 1) if i not in found)
        raise BadInput(f"{h.path}: {h.architecture}.block_count is {layers:,}, but the file has tensors for "
                       f"{len(found)} layers (none for blk.{gap})")


def _rows(h: GGUFHeader, tensor: str) -> tuple[int, ...]:
    info = h.tensors.get(tensor)
    if info is None or len(info.shape) != 2:
        raise BadInput(f"{h.path}: tensor {tensor} is missing (every {h.architecture} file has one)")
    return info.shape


def check_claims(h: GGUFHeader, c: Claims) -> None:
    """Every size the model would be built with is the size of a tensor in the file."""
    arch = h.architecture
    check_layers(h, c.layers)
    _, width = _rows(h, "token_embd.weight")
    if c.hidden != width:
        raise BadInput(f"{h.path}: {arch}.embedding_length is {c.hidden:,}, but tensor token_embd.weight has rows of "
                       f"{width}")
    for tensor, count, count_key in (("blk.0.attn_q.weight", c.heads, "attention.head_count"),
                                     ("blk.0.attn_k.weight", c.kv_heads, "attention.head_count_kv")):
        rows = _rows(h, tensor)[0]
        if count * c.head_dim != rows:
            raise BadInput(f"{h.path}: {arch}.{count_key} {count:,} x head size {c.head_dim:,} ({c.head_dim_key}) "
                           f"= {count * c.head_dim:,}, but tensor {tensor} has {rows} rows")
    rows = _rows(h, "blk.0.ffn_up.weight")[0]
    if c.ffn != rows:
        raise BadInput(f"{h.path}: {arch}.feed_forward_length is {c.ffn:,}, but tensor blk.0.ffn_up.weight has "
                       f"{rows} rows")
