"""Attention over the paged KV pool: a torch reference for CPU and CUDA, a Triton decode kernel used
on CUDA (or anywhere under TRITON_INTERPRET=1, which is how the CPU tests run it), and a C++ kernel
for the CPU that reads the pool in place (cpu_kernels, beside its fused elementwise ops and sampler).
Imports no UI library."""

import os

import torch

from batchtop.gpu_kernels import cpu_kernels, triton_decode
from batchtop.gpu_kernels.paged_attention import (decode_mask, gather_kv, paged_decode_attention, prefill_attention,
                                                  store_kv)


def uses_triton(device: torch.device) -> bool:
    """Whether decode attention on this device runs the Triton kernel rather than the reference."""
    return triton_decode.available() and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")


def uses_cpu_kernel(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether attention on this device runs the C++ CPU kernel (decode rows, and prompt chunks the
    runner hands it) rather than the reference."""
    return device.type == "cpu" and not uses_triton(device) and cpu_kernels.usable(dtype, head_dim)


def needs_decode_mask(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Only the torch reference reads the dense decode mask; the kernels stop at each context length."""
    return not uses_triton(device) and not uses_cpu_kernel(device, dtype, head_dim)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                     context_lens: torch.Tensor, scale: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """paged_decode_attention's math, by the fastest implementation this device has (the kernels
    need no mask; the reference takes a prebuilt one)."""
    if uses_triton(q.device):
        return triton_decode.paged_decode_attention_triton(q, k_cache, v_cache, block_tables, context_lens, scale)
    if uses_cpu_kernel(q.device, q.dtype, q.shape[-1]):
        return cpu_kernels.paged_attention(q, k_cache, v_cache, block_tables, None, context_lens, scale)
    return paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, mask)


__all__ = ["decode_attention", "decode_mask", "gather_kv", "needs_decode_mask", "paged_decode_attention",
           "prefill_attention", "store_kv", "uses_cpu_kernel", "uses_triton"]
