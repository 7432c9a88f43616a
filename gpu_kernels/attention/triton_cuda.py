"""Triton on CUDA (or on the CPU under TRITON_INTERPRET=1, as the tests run it): decode rows through the
split-KV kernel (triton_decode), which stops at each context length on the device, so one captured CUDA
graph serves any context; prefill rows through gpu_kernels/triton_prefill's varlen kernel where that
module is importable, else through the batched SDPA call."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from batchtop.gpu_kernels import triton_decode, uses_triton
from batchtop.gpu_kernels.attention.base import AttentionBackend
from batchtop.gpu_kernels.attention.padded_sdpa import padded_prefill_attention
from batchtop.gpu_kernels.attention.prefill_plan import PrefillPlan

PREFILL_MODULE = "batchtop.gpu_kernels.triton_prefill"


def find_prefill_kernel() -> Callable | None:
    """paged_prefill_attention_triton, or None where its module is absent or cannot be imported here."""
    try:
        return importlib.import_module(PREFILL_MODULE).paged_prefill_attention_triton
    except (ImportError, AttributeError):
        return None


class TritonCuda(AttentionBackend):
    name = "triton_cuda"
    captures_decode_graphs = True

    def __init__(self) -> None:
        self.prefill_kernel = find_prefill_kernel()  # looked up once per engine

    @classmethod
    def usable(cls, device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
        return uses_triton(device)

    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
               context_lens: torch.Tensor, scale: float, mask: torch.Tensor | None = None) -> torch.Tensor:
        return triton_decode.paged_decode_attention_triton(q, k_cache, v_cache, block_tables, context_lens, scale)

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, plan: PrefillPlan, scale: float) -> torch.Tensor:
        if self.prefill_kernel is None:
            return padded_prefill_attention(q, k, v, k_cache, v_cache, plan, scale)
        return self.prefill_kernel(q, k_cache, v_cache, plan.block_tables, plan.query_start_loc,
                                   plan.context_starts, scale)
