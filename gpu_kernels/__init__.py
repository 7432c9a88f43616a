"""Attention over the paged KV pool: a torch reference for CPU and CUDA, and a Triton decode kernel
used on CUDA (or anywhere under TRITON_INTERPRET=1, which is how the CPU tests run it). Imports no UI
library."""

import os

import torch

from batchtop.gpu_kernels import triton_decode
from batchtop.gpu_kernels.paged_attention import (decode_mask, gather_kv, paged_decode_attention, prefill_attention,
                                                  store_kv)


def uses_triton(device: torch.device) -> bool:
    """Whether decode attention on this device runs the Triton kernel rather than the reference."""
    return triton_decode.available() and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                     context_lens: torch.Tensor, scale: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """paged_decode_attention's math, by the fastest implementation this device has (the kernel
    needs no mask; the reference takes a prebuilt one)."""
    if uses_triton(q.device):
        return triton_decode.paged_decode_attention_triton(q, k_cache, v_cache, block_tables, context_lens, scale)
    return paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, mask)


__all__ = ["decode_attention", "decode_mask", "gather_kv", "paged_decode_attention", "prefill_attention", "store_kv", "uses_triton"]
