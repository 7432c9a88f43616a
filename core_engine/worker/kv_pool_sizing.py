"""How many KV blocks a GPU holds, the way vLLM sizes its pool: after the weights load, one dummy
forward at the full token budget (every row through the lm_head) measures the activation peak, and
the pool gets what is left of total x --gpu-memory-utilization once the weights, that peak, what
other processes hold, the CUDA graphs' pool and a margin are taken out. A guess from the model's
dims (the fixed 2 GiB reserve this replaces) cannot see another process's memory or an allocator's
fragmentation; a measured forward and torch.cuda.mem_get_info can.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from batchtop.core_engine.errors import ConfigError

GIB = 1 << 30
MARGIN = GIB // 2  # the allocator's fragmentation and the sampler's small tensors
GRAPH_POOL = GIB // 4  # what capturing the decode buckets' CUDA graphs adds (vLLM keeps a like reserve)


@dataclass(frozen=True, slots=True)
class MemoryFigures:
    """Bytes, as torch.cuda reports them after the profiling forward (its activations freed)."""

    total: int  # the device's memory
    free: int  # mem_get_info's free bytes now: our weights, other processes, other engines' pools are in use
    weights: int  # the model's parameters (part of what is in use)
    activation_peak: int  # the profiling forward's peak above what was allocated before it
    graphs: int = 0  # CUDA graphs' pool, when decode steps are captured

    @property
    def others(self) -> int:
        """In use besides our weights: other processes, another engine's pool, the CUDA context."""
        return max(0, self.total - self.free - self.weights)


def kv_pool_bytes(figures: MemoryFigures, utilization: float) -> int:
    """Bytes the KV pool may take; ConfigError naming --gpu-memory-utilization when nothing is left."""
    f = figures
    budget = int(f.total * utilization)
    pool = budget - (f.total - f.free) - f.activation_peak - f.graphs - MARGIN
    if pool <= 0:
        raise ConfigError("gpu_memory_utilization", (
            f"{utilization} of {f.total / GIB:.1f} GiB is {budget / GIB:.1f} GiB, and none of it is left for the "
            f"KV cache: weights {f.weights / GIB:.2f} GiB, a full-budget forward's activations "
            f"{f.activation_peak / GIB:.2f} GiB, other processes and pools {f.others / GIB:.2f} GiB, CUDA graphs "
            f"{f.graphs / GIB:.2f} GiB and a {MARGIN / GIB:.1f} GiB margin; raise --gpu-memory-utilization, "
            "lower --max-num-batched-tokens, or free the GPU"))
    return pool


def pool_sizing_note(figures: MemoryFigures, utilization: float, blocks: int, block_bytes: int) -> str:
    """The startup line that says how the pool was sized."""
    f = figures
    return (f"KV pool: {blocks} blocks ({blocks * block_bytes / GIB:.2f} GiB) of {utilization} x "
            f"{f.total / GIB:.1f} GiB less weights {f.weights / GIB:.2f}, activations {f.activation_peak / GIB:.2f} "
            f"(a forward at the full token budget, measured), other processes and pools {f.others / GIB:.2f}, "
            f"graphs {f.graphs / GIB:.2f} and a {MARGIN / GIB:.1f} GiB margin")


def measure_peak(forward: Callable[[], object], device: torch.device) -> int:
    """Bytes a forward allocates at its peak above what was allocated before it (CUDA; 0 elsewhere,
    where no pool is sized from memory)."""
    if device.type != "cuda":
        forward()
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    forward()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def device_memory(device: torch.device, weights: int, activation_peak: int, graphs: int) -> MemoryFigures:
    """The figures now, with the profile's freed activations handed back to the device first."""
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return MemoryFigures(total, free, weights, activation_peak, graphs)
