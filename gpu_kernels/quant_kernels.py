"""Linear layers on GGUF-quantized weights, in batchtop's C++ CPU kernel library (csrc/linear_quant_cpu.cpp).

The weight stays as the file stores it: a uint8 tensor (N, row_bytes), row n holding output feature n's
K / block_size blocks. The kernel quantizes each activation row to int8 blocks of 32 (so a row's result
never depends on the rows beside it) and takes integer dot products with the blocks (AVX-512 VNNI, else
AVX2), summed in fp32 in a fixed order; x and the result are bf16 or float32, the same integer math either
way. `QUANT_TYPES` names the five block formats it reads.

Q4_0, Q4_1 and Q8_0 run (on AVX-512 VNNI) from a repack of the blocks, 16 output columns interleaved
(csrc/quant_repack.h), built on a matrix's first use and cached by the blocks' identity, storage and version
(`pack`): the pack is held beside the file's blocks, a second copy of about the same size, for as long as
the blocks live, on memory advised for huge pages (huge_pages.py). The other types (and other CPUs) read
the blocks as they are.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from batchtop.gpu_kernels import cpu_kernels, huge_pages


@dataclass(frozen=True, slots=True)
class QuantType:
    name: str
    ggml_id: int
    block_size: int  # weights a block
    block_bytes: int

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.block_bytes / self.block_size


def _quant_type(name: str) -> QuantType:
    kind = GGMLQuantizationType[name]
    return QuantType(name, int(kind), *GGML_QUANT_SIZES[kind])  # the gguf package's own block table


QUANT_TYPES: dict[str, QuantType] = {name: _quant_type(name) for name in ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K")}
EPILOGUES = {"store": 0, "silu_mul": 1, "add_into": 2}


def quant_type(name: str) -> QuantType:
    try:
        return QUANT_TYPES[name]
    except KeyError:
        raise ValueError(f"unknown quantized type {name!r}: one of {', '.join(QUANT_TYPES)}") from None


def usable(qtype_name: str) -> bool:
    """Whether linear_quant runs `qtype_name` here: the kernels built and loaded, the op in them, this CPU able."""
    if qtype_name not in QUANT_TYPES or not cpu_kernels.available():
        return False
    supported = _supported.get(qtype_name)
    if supported is None:  # asked once the kernels are in: every step asks, and the answer cannot change
        ops = torch.ops.batchtop_cpu
        supported = hasattr(ops, "linear_quant") and bool(ops.linear_quant_supported(QUANT_TYPES[qtype_name].ggml_id))
        _supported[qtype_name] = supported
    return supported


_supported: dict[str, bool] = {}  # type name -> whether the loaded kernels compute it


_packs: dict[tuple, torch.Tensor] = {}  # (id, data_ptr, version, ggml id) of live blocks -> their pack


def _blocks_key(blocks: torch.Tensor, ggml_id: int) -> tuple:
    # as core_engine/model/packed_linear.py's weight_key: changes when the blocks are replaced or written to
    return id(blocks), blocks.data_ptr(), None if blocks.is_inference() else blocks._version, ggml_id


def pack(blocks: torch.Tensor, qtype_name: str) -> torch.Tensor:
    """What linear_quant's op and the fused decoder layer read for the block matrix `blocks` (N, row_bytes)
    of `qtype_name`: its 16-column repack (built once, then cached while `blocks` lives and is unchanged),
    or `blocks` itself for a type without one here."""
    qtype = quant_type(qtype_name)
    key = _blocks_key(blocks, qtype.ggml_id)
    packed = _packs.get(key)
    if packed is None:
        stale = [k for k in _packs if k[0] == key[0] and k[3] == key[3]]
        for k in stale:  # the same blocks before a write: that pack is no longer theirs
            del _packs[k]
        packed = torch.ops.batchtop_cpu.pack_linear_quant(blocks.detach(), qtype.ggml_id)
        if packed is blocks or packed.data_ptr() == blocks.data_ptr():
            return blocks
        packed = huge_pages.place(packed)
        _packs[key] = packed
        weakref.finalize(blocks, _packs.pop, key, None)
    return packed


EMBEDDED = ("Q4_0", "Q4_1", "Q8_0")  # the types quant_embedding dequantizes


def embeds(qtype_name: str, dtype: torch.dtype) -> bool:
    """Whether quant_embedding looks up rows of `qtype_name` blocks in `dtype` here (the kernels loaded)."""
    return (qtype_name in EMBEDDED and dtype in (torch.bfloat16, torch.float32) and cpu_kernels.available()
            and hasattr(torch.ops.batchtop_cpu, "quant_embedding"))


def quant_embedding(blocks: torch.Tensor, ids: torch.Tensor, qtype_name: str, dtype: torch.dtype) -> torch.Tensor:
    """Rows `ids` (T,) of the (N, row_bytes) block matrix dequantized to (T, K) `dtype`: in one op the bits
    core_engine/model/quant_blocks.dequantize gives, rounded to `dtype` (a step's token embeddings)."""
    qtype = quant_type(qtype_name)
    out = torch.empty(ids.shape[0], blocks.shape[1] // qtype.block_bytes * qtype.block_size, dtype=dtype)
    torch.ops.batchtop_cpu.quant_embedding(out, blocks, ids.contiguous().long(), qtype.ggml_id)
    return out


def linear_quant(x: torch.Tensor, blocks: torch.Tensor, qtype_name: str, bias: torch.Tensor | None,
                 out_features: int, epilogue: str = "store", out: torch.Tensor | None = None,
                 packed: bool = False) -> torch.Tensor:
    """x (rows, K) bf16 or float32 times the block matrix's W^T (+ bias, in x's dtype), the result in x's dtype;
    packed: `blocks` is pack()'s result.

    epilogue "store": returns (rows, out_features); "silu_mul": W's rows are [gate; up] and the result is
    silu(gate) * up, (rows, out_features // 2); "add_into": `out` += x W^T + bias in place (out required).
    out_features is the block matrix's N (its rows)."""
    qtype = quant_type(qtype_name)
    if epilogue not in EPILOGUES:
        raise ValueError(f"unknown epilogue {epilogue!r}: one of {', '.join(EPILOGUES)}")
    if not packed and (blocks.dim() != 2 or blocks.shape[0] != out_features):
        raise ValueError(f"linear_quant: blocks {tuple(blocks.shape)} do not hold {out_features} output features")
    if x.dim() == 2 and x.stride(-1) != 1:
        x = x.contiguous()
    if out is None:
        if epilogue == "add_into":
            raise ValueError("linear_quant: epilogue 'add_into' adds into `out`: pass it")
        cols = out_features // 2 if epilogue == "silu_mul" else out_features
        out = torch.empty((x.shape[0], cols), dtype=x.dtype)
    weights = blocks if packed else pack(blocks, qtype_name)
    torch.ops.batchtop_cpu.linear_quant(out, x, weights, qtype.ggml_id, bias, EPILOGUES[epilogue])
    return out
