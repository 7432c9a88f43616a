"""Fit the calibration constants to measured steps: least squares on relative step-time errors.

The model's two max()es (the GEMMs' and attention's, summed) make it piecewise linear, so the two
efficiencies are searched on a log grid (closed-form overhead for each pair) rather than solved for.
When the measured steps never touch one roof (a GPU decode sweep that never leaves the memory roof,
say), every efficiency past some bound fits them equally well: the fit then keeps the value nearest
the defaults and reports the range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from batchtop.core_engine.measure.device_peaks import DevicePeaks
from batchtop.core_engine.simulate.calibration import DEFAULT, Calibration
from batchtop.core_engine.measure.decode_sweep import StepSample

EFFICIENCIES = np.geomspace(0.01, 100.0, 801)  # 1.2% apart
MIN_OVERHEAD_S = 1e-6  # nothing runs in no time; a fit that finds none keeps a microsecond
REFINE = np.geomspace(1 / 1.0117, 1.0117, 41)  # the finer grid, one coarse step either side
EQUALLY_GOOD = 1e-3  # relative slack in the squared error within which two fits count as the same


@dataclass(frozen=True, slots=True)
class Fit:
    calibration: Calibration
    rms_relative_error: float  # over the samples it was fitted to
    ranges: dict[str, tuple[float, float]]  # each efficiency's span among equally good fits

    def as_dict(self) -> dict:
        return {"rms_relative_error": self.rms_relative_error,
                "equally_good_ranges": {k: list(v) for k, v in self.ranges.items()}}


def predict(calibration: Calibration, sample: StepSample, peaks: DevicePeaks) -> float:
    return calibration.step_overhead_s + calibration.device_time(sample.cost, peaks)


def _work(samples: list[StepSample]) -> tuple[np.ndarray, ...]:
    """The samples' weight FLOPs, GEMM bytes (all but the KV's), attention FLOPs, KV bytes and seconds."""
    costs = [s.cost for s in samples]
    return (np.array([c.weight_flops for c in costs]), np.array([c.bytes - c.kv_bytes for c in costs]),
            np.array([c.attn_flops for c in costs]), np.array([c.kv_bytes for c in costs]),
            np.array([s.seconds for s in samples]))


def _errors(work: tuple[np.ndarray, ...], peaks: DevicePeaks, compute: np.ndarray,
            memory: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Squared relative error and best overhead for every (compute, memory) efficiency pair."""
    weight_flops, matmul_bytes, attn_flops, kv_bytes, seconds = work
    weight = 1.0 / seconds ** 2  # relative errors: a 5 ms step counts as much as a 500 ms one
    bandwidth = peaks.peak_bytes_per_s * memory[:, None]
    matmul_memory, attn_memory = matmul_bytes[None, :] / bandwidth, kv_bytes[None, :] / bandwidth  # (em, sample)
    errors = np.empty((len(compute), len(memory)))
    overheads = np.empty_like(errors)
    for i, ec in enumerate(compute):
        flop_rate = peaks.peak_flops * ec
        device = (np.maximum(weight_flops[None, :] / flop_rate, matmul_memory)
                  + np.maximum(attn_flops[None, :] / flop_rate, attn_memory))
        overhead = np.clip(((seconds - device) * weight).sum(1) / weight.sum(), MIN_OVERHEAD_S, None)
        errors[i] = (((device + overhead[:, None] - seconds) / seconds) ** 2).sum(1)
        overheads[i] = overhead
    return errors, overheads


def fit_calibration(samples: list[StepSample], peaks: DevicePeaks, *, source: str, fitted_on: dict,
                    near: Calibration = DEFAULT) -> Fit:
    if not samples:
        raise ValueError("no measured steps to fit")
    work = _work(samples)
    errors, _ = _errors(work, peaks, EFFICIENCIES, EFFICIENCIES)
    ec_i, em_i = np.nonzero(errors <= errors.min() * (1 + EQUALLY_GOOD) + 1e-15)
    distance = (np.abs(np.log(EFFICIENCIES[ec_i] / near.compute_efficiency))
                + np.abs(np.log(EFFICIENCIES[em_i] / near.memory_efficiency)))
    k = int(distance.argmin())
    # then a finer grid around the chosen pair
    compute = EFFICIENCIES[ec_i[k]] * REFINE
    memory = EFFICIENCIES[em_i[k]] * REFINE
    fine, overheads = _errors(work, peaks, compute, memory)
    i, j = np.unravel_index(int(fine.argmin()), fine.shape)
    calibration = Calibration(float(compute[i]), float(memory[j]), float(overheads[i, j]),
                              source=source, fitted_on=fitted_on)
    ranges = {"compute_efficiency": (float(EFFICIENCIES[ec_i].min()), float(EFFICIENCIES[ec_i].max())),
              "memory_efficiency": (float(EFFICIENCIES[em_i].min()), float(EFFICIENCIES[em_i].max()))}
    return Fit(calibration, math.sqrt(float(fine[i, j]) / len(samples)), ranges)
