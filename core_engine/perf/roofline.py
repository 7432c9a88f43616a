"""The roofline time model: how long a step's device work takes at given roofs, and what bounds it.

Time of a step's device work, at roofs of F FLOP/s and B bytes/s: the GEMMs and attention are separate
kernels that run one after the other (paged/flash attention sits between the projections, on a CPU
as on a GPU), so each is bound by its own roof and their times add:

  matmul time    = max(weight FLOPs / F, (bytes - KV bytes) / B)      weights and activations
  attention time = max(attention FLOPs / F, KV bytes / B_kv)
  device time    = matmul time + attention time

B_kv is the bandwidth the attention kernels reach on the KV cache, B unless given: a kernel that
gathers each row's blocks from the pool need not stream them as fast as a GEMM streams its weights.

One max() over the step's totals would hide the KV read under the GEMMs' compute roof once a batch
is compute-bound, and charge nothing for a longer context.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from batchtop.core_engine.model.cost import StepCost
from batchtop.core_engine.perf.device_peaks import DATASHEET, GIB


def bound(intensity: float, ridge_flop_per_byte: float) -> str:
    return "memory-bound" if intensity < ridge_flop_per_byte else "compute-bound"


def gpu_ridges() -> tuple[int, int]:
    """The lowest and highest ridge (FLOP/byte) of the datasheet's data-centre GPUs (40 GiB and more),
    rounded out to tens. A bf16 decode step's GEMMs do about one FLOP per weight byte per row, so this
    is also about how many decode rows such a GPU keeps memory-bound."""
    ridges = [flops / bandwidth for _, flops, bandwidth, memory in DATASHEET if memory >= 40 * GIB]
    return math.floor(min(ridges) / 10) * 10, math.ceil(max(ridges) / 10) * 10


def device_regime(step_bound: str, ridge_flop_per_byte: float) -> tuple[str, str] | None:
    """Why a decode step reads compute-bound where the teaching text says memory-bound: this device's
    ridge (a CPU's: 6-20 FLOP/byte; an AVX2 CPU computes bf16 as unpacked fp32 FMAs, ridge ~9) sits far
    left of a GPU's, so a few rows already cross it. (what the verdict adds after "compute-bound", the
    line that says what a GPU would show); None where the verdict needs no such word."""
    low, high = gpu_ridges()
    if step_bound != "compute-bound" or ridge_flop_per_byte >= low:
        return None
    return (f" on this device (ridge {ridge_flop_per_byte:.0f} FLOP/B)",
            f"a GPU's ridge is {low}-{high} FLOP/B: decode there stays memory-bound to ~{low} rows")


def kernel_bounds(cost: StepCost, ridge_flop_per_byte: float) -> dict[str, str]:
    """The roof each of the step's kernels is under: its GEMMs (weight FLOPs against every byte but the
    KV's) and its attention (against the KV read). The step's own intensity averages the two, so a
    large decode batch can sit left of the ridge while its GEMMs are past it."""
    gemm_bytes = cost.bytes - cost.kv_bytes
    return {"GEMMs": bound(cost.weight_flops / gemm_bytes if gemm_bytes > 0 else 0.0, ridge_flop_per_byte),
            "attention": bound(cost.attn_flops / cost.kv_bytes if cost.kv_bytes > 0 else 0.0, ridge_flop_per_byte)}


def matmul_time(cost: StepCost, peak_flops: float, peak_bytes_per_s: float) -> float:
    """The GEMMs: every weight and activation byte, against the weight FLOPs."""
    return max(cost.weight_flops / peak_flops, (cost.bytes - cost.kv_bytes) / peak_bytes_per_s)


def attention_time(cost: StepCost, peak_flops: float, peak_bytes_per_s: float,
                   kv_bytes_per_s: float | None = None) -> float:
    """Attention: the KV cache read and written (at kv_bytes_per_s, peak_bytes_per_s unless given),
    against QK^T and PV."""
    kv_rate = peak_bytes_per_s if kv_bytes_per_s is None else kv_bytes_per_s
    return max(cost.attn_flops / peak_flops, cost.kv_bytes / kv_rate)


def device_time(cost: StepCost, peak_flops: float, peak_bytes_per_s: float,
                kv_bytes_per_s: float | None = None) -> float:
    """The roofline model's time for a step: its GEMMs, then its attention, each at its own roof."""
    return (matmul_time(cost, peak_flops, peak_bytes_per_s)
            + attention_time(cost, peak_flops, peak_bytes_per_s, kv_bytes_per_s))


def one_more_row(cost: StepCost, batch: int) -> StepCost:
    """The step with one more row like the average of its `batch`: everything grows by 1/batch but
    the weights, which are read once whatever the batch."""
    grow = 1.0 + 1.0 / batch
    return StepCost(flops=cost.flops * grow, bytes=cost.weight_bytes + (cost.bytes - cost.weight_bytes) * grow,
                    weight_flops=cost.weight_flops * grow, attn_flops=cost.attn_flops * grow,
                    weight_bytes=cost.weight_bytes, kv_bytes=cost.kv_bytes * grow)


def marginal_sequence_cost(cost: StepCost, batch: int, peak_flops: float, peak_bytes_per_s: float) -> float:
    """Predicted relative step-time increase from one more sequence like the average one in this batch,
    by the same model the what-if mode times steps with (device work only).

    Weight bytes are read once per step whatever the batch, so while the GEMMs are memory-bound the
    increase is the extra row's activations and KV read; once they are compute-bound, every extra row
    adds its FLOPs to them, and its KV read to attention.
    """
    return one_more_row_increase(cost, batch, lambda c: device_time(c, peak_flops, peak_bytes_per_s))


def one_more_row_increase(cost: StepCost, batch: int, time_of: Callable[[StepCost], float]) -> float:
    """time_of(the step with one more row) / time_of(the step) - 1; 0 for an empty step."""
    if batch < 1 or cost.bytes <= 0:
        return 0.0
    return time_of(one_more_row(cost, batch)) / time_of(cost) - 1.0
