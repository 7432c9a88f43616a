"""Paged decode attention in Triton, split-KV (flash-decoding): reads each sequence's blocks in place.

Same math as paged_attention.paged_decode_attention (the readable definition): one query token per
sequence, attending to its first context_lens[b] keys, which live in the blocks its block table lists.
The keys of each (sequence, KV head) are cut into splits that run as separate programs, so a batch of
one still fills the GPU; each split is an online softmax over tiles of TILE keys with tensor-core dots,
and a second small kernel merges the splits by their log-sum-exp (triton_decode_kernels has both).
The number of splits depends only on the batch shape, the table width and the device, never on the
lengths, so a captured CUDA graph replays correctly at any context. On CUDA it is what the model calls
for decode rows; tests run it on the CPU under Triton's interpreter (TRITON_INTERPRET=1).
"""

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import torch

import batchtop.gpu_kernels.triton_decode_kernels as kernels

TILE = 64  # keys per loop iteration: 4 blocks of 16, and the N of the score dot
MAX_SPLITS = 32
INTERPRETER_SMS = 4  # the interpreter has no SMs: 4 gives small CPU batches a few splits and the merge
_LOG2_E = 1.4426950408889634


def available() -> bool:
    return kernels.triton is not None


@functools.cache
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else INTERPRETER_SMS


def choose_num_splits(batch: int, kv_heads: int, table_width: int, block_size: int, sms: int) -> int:
    """Splits per (sequence, KV head): enough programs for one per SM, no more than the widest table
    can fill with whole tiles, at most MAX_SPLITS. Host-side shapes only, so fixed per captured graph."""
    wanted = math.ceil(sms / max(1, batch * kv_heads))
    fillable = math.ceil(table_width * block_size / TILE)
    return max(1, min(wanted, fillable, MAX_SPLITS))


def _pow2(n: int, least: int = 1) -> int:
    return max(least, 1 << max(0, (n - 1).bit_length()))


class Launch(NamedTuple):
    kernel: Callable  # the plain function; triton_decode_kernels.jit makes it launchable
    grid: tuple[int, ...]
    args: tuple
    constexprs: dict


def plan(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
         context_lens: torch.Tensor, scale: float, num_splits: int | None = None) -> tuple[torch.Tensor, list[Launch]]:
    """The output tensor and the kernel launches that fill it (also what the offline sm_90 compile
    builds its signatures from, on meta tensors)."""
    b, nh, hd = q.shape
    _, bs, kvh, _ = k_cache.shape
    assert q.stride(2) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous() and block_tables.stride(1) == 1
    splits = num_splits or choose_num_splits(b, kvh, block_tables.shape[1], bs, num_sms(q.device))
    out = torch.empty((b, nh, hd), dtype=q.dtype, device=q.device)
    if splits > 1:  # inside a graph capture these come from the graph's pool, as the graph needs
        parts = torch.empty((b, nh, splits, hd), dtype=torch.float32, device=q.device)
        lse = torch.empty((b, nh, splits), dtype=torch.float32, device=q.device)
    else:
        parts, lse = out[:, :, None, :], out[:, :, None, 0]  # unused: the kernel writes `out` itself
    group, hd_p = nh // kvh, _pow2(hd, 16)
    launches = [Launch(kernels._split_kernel, (b, kvh, splits), (
        q, k_cache, v_cache, out, parts, lse, block_tables, context_lens, scale * _LOG2_E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        parts.stride(0), parts.stride(1), parts.stride(2), lse.stride(0), lse.stride(1)),
        dict(GROUP=group, GROUP_P=_pow2(group, 16), HD=hd, HD_P=hd_p, BS=bs, TILE=TILE, SPLITS=splits,
             DIRECT=splits == 1, PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32"))]
    if splits > 1:
        launches.append(Launch(kernels._merge_kernel, (b, nh), (
            parts, lse, out, context_lens, parts.stride(0), parts.stride(1), parts.stride(2),
            lse.stride(0), lse.stride(1), out.stride(0), out.stride(1)),
            dict(HD=hd, HD_P=hd_p, TILE=TILE, SPLITS=splits, SPLITS_P=_pow2(splits))))
    return out, launches


def paged_decode_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  block_tables: torch.Tensor, context_lens: torch.Tensor,
                                  scale: float, num_splits: int | None = None) -> torch.Tensor:
    """q: (B, nh, hd), its last dim contiguous; caches (num_blocks, block_size, kvh, hd), contiguous;
    block_tables (B, >= needed blocks), rows contiguous; context_lens (B,) >= 1. Returns (B, nh, hd) in
    q's dtype. num_splits overrides choose_num_splits (tests use it to place split boundaries)."""
    out, launches = plan(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits)
    for launch in launches if q.shape[0] else ():  # no rows: nothing to launch
        kernels.jit(launch.kernel)[launch.grid](*launch.args, **launch.constexprs)
    return out
