"""Paged prefill attention in Triton: every prefill row of a step in one call per layer (varlen, causal).

Same math as paged_attention.gather_kv + prefill_attention per chunk (the readable definition): the
step's prefill chunks are concatenated in q; chunk s holds rows query_start_loc[s]..query_start_loc[s+1]
of a sequence that had context_starts[s] tokens cached before it, and its row i (absolute position
context_starts[s] + i) attends to that sequence's keys 0..context_starts[s] + i, read in place from the
blocks its block table lists (the chunk's own K/V already written there). GQA: nh = kvh * group.
triton_prefill_kernels has the kernel and how its grid is laid out; nothing here syncs with the device.
On CUDA this is what the attention backend calls for prefill rows; tests run it on the CPU under
Triton's interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

import batchtop.gpu_kernels.triton_decode_kernels as decode_kernels
import batchtop.gpu_kernels.triton_prefill_kernels as kernels

_LOG2_E = 1.4426950408889634


def available() -> bool:
    return decode_kernels.triton is not None


class Launch(NamedTuple):
    kernel: Callable  # the plain function; triton_decode_kernels.jit makes it launchable
    grid: tuple[int, ...]
    args: tuple
    constexprs: dict
    options: dict  # launch options (num_warps, num_stages), not kernel arguments


def _pow2(n: int, least: int = 1) -> int:
    return max(least, 1 << max(0, (n - 1).bit_length()))


def tile_shape(group: int, head_dim: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): BLOCK_M dot rows hold BLOCK_M // group query rows x the group's heads.
    16-bit: 128 x 64 over 8 warps keeps the fp32 accumulator and the scores in registers at head dim 128
    (the usual flash-attention tile; sm_90: 181 registers, no spills). fp32 dots run on CUDA cores, not
    tensor cores: 32 x 16 over 8 warps is the largest tile that ptxas keeps in registers at head dim 128."""
    if dtype == torch.float32:
        block_m, block_n, warps = 32, 16, 8
    else:
        block_m, block_n, warps = (128, 64, 8) if head_dim <= 128 else (64, 32, 8)
    return max(block_m, _pow2(group, 16)), block_n, warps


def plan(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
         query_start_loc: torch.Tensor, context_starts: torch.Tensor, scale: float,
         block_m: int | None = None, block_n: int | None = None) -> tuple[torch.Tensor, Launch]:
    """The output tensor and the launch that fills it (also what the offline sm_90 compile builds its
    signature from, on meta tensors)."""
    t, nh, hd = q.shape
    _, bs, kvh, _ = k_cache.shape
    if q.stride(2) != 1 or not (k_cache.is_contiguous() and v_cache.is_contiguous()) or block_tables.stride(1) != 1:
        raise ValueError("paged_prefill_attention_triton: q's last dim, the caches and the table rows must be "
                         "contiguous")
    if nh % kvh or k_cache.shape[-1] != hd or v_cache.shape != k_cache.shape:
        raise ValueError(f"paged_prefill_attention_triton: q has {nh} heads of {hd}, the caches "
                         f"{tuple(k_cache.shape)} / {tuple(v_cache.shape)}: need heads = kv_heads x group, "
                         "same head dim")
    group = nh // kvh
    default_m, default_n, warps = tile_shape(group, hd, k_cache.dtype)
    block_m, block_n = block_m or default_m, block_n or default_n
    block_q = block_m // group
    if block_q < 1:
        raise ValueError(f"paged_prefill_attention_triton: block_m {block_m} is smaller than the group {group}")
    chunks = query_start_loc.shape[0] - 1
    num_tiles = t // block_q + chunks  # every chunk's tiles fit: see triton_prefill_kernels
    out = torch.empty((t, nh, hd), dtype=q.dtype, device=q.device)
    launch = Launch(kernels._prefill_kernel, (num_tiles, kvh), (
        q, k_cache, v_cache, out, block_tables, query_start_loc, context_starts, scale * _LOG2_E, chunks, num_tiles,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1)),
        dict(GROUP=group, BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=block_n, HD=hd, HD_P=_pow2(hd, 16), BS=bs,
             PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32"),
        dict(num_warps=warps))
    return out, launch


def paged_prefill_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                   block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                                   context_starts: torch.Tensor, scale: float, *,
                                   block_m: int | None = None, block_n: int | None = None) -> torch.Tensor:
    """q: (T, nh, hd), its last dim contiguous (a view of the fused qkv projection is fine); caches
    (num_blocks, block_size, kvh, hd), contiguous; block_tables (S, W) int32/int64, rows contiguous, padded
    with any valid block; query_start_loc (S+1,) int32 cumulative rows; context_starts (S,) int32.
    Returns (T, nh, hd) in q's dtype. block_m / block_n override tile_shape (tests use them to put tile
    edges inside small chunks)."""
    out, launch = plan(q, k_cache, v_cache, block_tables, query_start_loc, context_starts, scale, block_m, block_n)
    if q.shape[0]:  # no rows: nothing to launch
        decode_kernels.jit(launch.kernel)[launch.grid](*launch.args, **launch.constexprs, **launch.options)
    return out
