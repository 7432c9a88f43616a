"""Which attention backend an engine runs, chosen once when its runner is built: the first in BACKENDS
usable for the device, dtype and head size. A new kernel is a new AttentionBackend subclass and a line
here."""

from __future__ import annotations

import torch

from batchtop.gpu_kernels.attention.base import AttentionBackend
from batchtop.gpu_kernels.attention.cpu_kernels import CpuKernels
from batchtop.gpu_kernels.attention.torch_reference import TorchReference
from batchtop.gpu_kernels.attention.triton_cuda import TritonCuda

BACKENDS: tuple[type[AttentionBackend], ...] = (
    TritonCuda,  # CUDA, or anywhere under TRITON_INTERPRET=1
    CpuKernels,  # batchtop's C++ kernels, once built
    TorchReference,  # anywhere
)


def select_backend(device: torch.device | str, dtype: torch.dtype, head_dim: int) -> AttentionBackend:
    """A new instance of the first backend that runs here (the runner holds it for the engine's life)."""
    device = torch.device(device)
    return next(cls for cls in BACKENDS if cls.usable(device, dtype, head_dim))()
