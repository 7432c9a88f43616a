"""Device and dtype resolution: which hardware we run on and which dtype is fast there."""

from __future__ import annotations

import functools
import platform

import torch

from batchtop.core_engine.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


@functools.cache
def _cpuinfo_field(name: str) -> str:
    """The first value of a /proc/cpuinfo field ('' where the file or field does not exist)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return ""


def cpu_flags() -> frozenset[str]:
    return frozenset(_cpuinfo_field("flags").split())


def cpu_has_fast_bf16() -> bool:
    """Whether bf16 beats fp32 here: where the CPU has native bf16 dot products (AVX512_BF16 or AMX), and
    on AVX2 with FMA where batchtop's CPU kernels can be built (their bf16 GEMMs read half the bytes of
    fp32 ones: a SmolLM2 step's 1.5-2.4x faster than oneDNN's fp32, bench/cpu_kernels.py)."""
    if cpu_has_native_bf16():
        return True
    from batchtop.gpu_kernels import cpu_kernels
    return {"avx2", "fma"} <= cpu_flags() and cpu_kernels.can_build()


def cpu_has_native_bf16() -> bool:
    """bf16 dot products in hardware (AVX512_BF16 or AMX): without them torch's bf16 GEMM is emulated."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device", "cuda was asked for but torch sees no CUDA device "
                                          f"(torch {torch.__version__}, cuda build: {torch.version.cuda})")
        return "cuda"
    if device == "cpu":
        return "cpu"
    raise ConfigError("device", f"unknown device {device!r} (choose auto, cpu or cuda)")


def resolve_dtype(dtype: str, device: str) -> str:
    name = DTYPE_ALIASES.get(dtype, dtype)
    if name == "auto":
        if device == "cuda":
            return "bfloat16"
        return "bfloat16" if cpu_has_fast_bf16() else "float32"
    if name not in DTYPES:
        raise ConfigError("dtype", f"unknown dtype {dtype!r} (choose auto, float32, bfloat16, float16)")
    return name


def device_name(device: str) -> str:
    """A human name for the device, as the status line and metrics show it."""
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return _cpuinfo_field("model name") or platform.processor() or platform.machine() or "cpu"
