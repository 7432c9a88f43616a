"""Attention over the paged KV pool: a torch reference for CPU and CUDA, a Triton decode kernel used
on CUDA (or anywhere under TRITON_INTERPRET=1, which is how the CPU tests run it), and a C++ kernel
for the CPU that reads the pool in place (cpu_kernels, beside its fused elementwise ops and sampler).
The engine runs them through attention/ (one backend class each, chosen once per engine by
attention.select_backend). Imports no UI library."""

import os

import torch

from batchtop.gpu_kernels import cpu_kernels, triton_decode
from batchtop.gpu_kernels.paged_attention import (decode_mask, gather_kv, paged_decode_attention, prefill_attention,
                                                  store_kv)


def uses_triton(device: torch.device) -> bool:
    """Whether attention on this device can run the Triton kernels (attention.triton_cuda)."""
    return triton_decode.available() and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")


def uses_cpu_kernel(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether attention on this device runs the C++ CPU kernel (attention.cpu_kernels: decode rows, and
    the prompt chunks the runner hands it) rather than the reference."""
    return device.type == "cpu" and not uses_triton(device) and cpu_kernels.usable(dtype, head_dim)


__all__ = ["decode_mask", "gather_kv", "paged_decode_attention", "prefill_attention", "store_kv", "uses_cpu_kernel",
           "uses_triton"]
