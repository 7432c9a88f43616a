"""GGUF block-quantized rows dequantized by torch: the reference for batchtop's quantized linears.

A quantized weight (N, K) is stored as llama.cpp stores it: each row is K / block_size blocks of
block_bytes bytes, so the matrix is uint8 (N, row_bytes). These functions turn such rows back into
float32 (N, K) with the same arithmetic, in the same order, as gguf.quants.dequantize (the `gguf`
package's numpy reference), vectorised so that they run on the CPU and on CUDA. They are the forward
wherever the C++ kernels do not run (CUDA, no compiler, BATCHTOP_CPU_KERNEL=0), and the definition
the kernels are tested against.
"""

from __future__ import annotations

import gguf
import torch

from batchtop.gpu_kernels.quant_kernels import QUANT_TYPES

# The types a quantized run keeps as blocks (the kernels' types); any other is dequantized to the run's dtype.
BLOCK_TYPES = tuple(QUANT_TYPES)


def block_shape(type_name: str) -> tuple[int, int]:
    """(weights a block, bytes a block) of a GGML type."""
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]


def bits_per_weight(type_name: str) -> float:
    """Stored bits per weight: Q4_1 5.0, Q8_0 8.5, Q4_K 4.5, Q6_K 6.5625, F16 16."""
    size, nbytes = block_shape(type_name)
    return 8 * nbytes / size


def ggml_id(type_name: str) -> int:
    return int(gguf.GGMLQuantizationType[type_name])


def row_bytes(type_name: str, in_features: int) -> int:
    size, nbytes = block_shape(type_name)
    if in_features % size:
        raise ValueError(f"{type_name} rows hold whole blocks of {size} weights; {in_features} is not a multiple")
    return in_features // size * nbytes


def _half(raw: torch.Tensor) -> torch.Tensor:
    """(blocks, 2) little-endian fp16 bytes -> (blocks, 1) float32."""
    return raw.contiguous().view(torch.float16).float()


def _bits(raw: torch.Tensor, groups: int, width: int, step: int) -> torch.Tensor:
    """(blocks, groups * width) bytes -> (blocks, groups, 8 / step, width): each group's bytes' lowest `step`
    bits, then the next `step`, ... (scalar shifts only: nothing is copied from the host, so a CUDA graph
    can capture it)."""
    raw = raw.reshape(raw.shape[0], groups, width)
    mask = (1 << step) - 1
    return torch.stack([(raw >> shift) & mask for shift in range(0, 8, step)], dim=2)


def _nibbles(raw: torch.Tensor, groups: int, width: int) -> torch.Tensor:
    """(blocks, groups * width) bytes -> (blocks, groups, 2, width): each group's low nibbles, then its high."""
    return _bits(raw, groups, width, 4)


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 2:], 1, 16).reshape(b.shape[0], 32).to(torch.int8) - 8
    return _half(b[:, :2]) * q.float()


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 4:], 1, 16).reshape(b.shape[0], 32).float()
    return _half(b[:, :2]) * q + _half(b[:, 2:4])


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].contiguous().view(torch.int8).float() * _half(b[:, :2])


def _q4_k_scales(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit scales and mins packed into 12 bytes: bytes 0-3 hold scales 0-3 (low 6 bits) and
    the top 2 bits of scales 4-7; bytes 4-7 the same for the mins; bytes 8-11 the low 4 bits of scale
    (low nibble) and min (high nibble) 4-7."""
    s = raw.reshape(raw.shape[0], 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    scales = torch.cat((d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)), dim=1)
    mins = torch.cat((m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)), dim=1)
    return scales, mins


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales, mins = _q4_k_scales(b[:, 4:16])
    d = (_half(b[:, :2]) * scales.float()).reshape(n, 8, 1)
    dm = (_half(b[:, 2:4]) * mins.float()).reshape(n, 8, 1)
    q = _nibbles(b[:, 16:], 4, 32).reshape(n, 8, 32).float()
    return (d * q - dm).reshape(n, 256)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    d = (_half(b[:, 208:210]) * scales).reshape(n, 16, 1)
    low = _nibbles(b[:, :128], 2, 64).reshape(n, 8, 32)
    high = _bits(b[:, 128:192], 2, 32, 2).reshape(n, 8, 32)
    q = (low | (high << 4)).to(torch.int8) - 32
    return (d * q.reshape(n, 16, 16).float()).reshape(n, 256)


DEQUANTIZE = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q6_K": _q6_k}


def dequantize(blocks: torch.Tensor, type_name: str) -> torch.Tensor:
    """uint8 (N, row_bytes) rows of `type_name` blocks -> float32 (N, K), on the blocks' device."""
    if blocks.dtype != torch.uint8 or blocks.dim() != 2:
        raise ValueError(f"expected uint8 (rows, row_bytes) blocks, got {blocks.dtype} {tuple(blocks.shape)}")
    size, nbytes = block_shape(type_name)
    rows, width = blocks.shape
    if width % nbytes:
        raise ValueError(f"{type_name} rows are whole blocks of {nbytes} bytes; a row of {width} bytes is not")
    flat = blocks.reshape(rows * (width // nbytes), nbytes)
    return DEQUANTIZE[type_name](flat).reshape(rows, width // nbytes * size)
