"""Fit the calibration constants to measured steps: least squares on relative step-time errors.

The model's two max()es (the GEMMs' and attention's, summed) make it piecewise linear, so the three
efficiencies are searched on grids (closed-form overhead for each triple) rather than solved for: a
coarse log grid over all three, then ever finer grids around each of its best few well-separated
triples (a coarse grid can rank a point that happens to lie near a narrow valley above a plateau it
samples less well). When the measured steps never touch one roof (a GPU decode sweep that never
leaves the memory roof, say), every efficiency past some bound fits them equally well: a fine scan of
each efficiency through the best fit finds that range, reports it, and keeps the value in it nearest
the defaults. When every step has the same context, each row's KV read grows exactly with its GEMM
work and the attention efficiency cannot be told from the others: it is held at the default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.simulate.calibration import DEFAULT, EFFICIENCY_RANGE, MAX_OVERHEAD_S, Calibration
from batchtop.core_engine.perf.decode_sweep import StepSample

EFFICIENCY_NAMES = ("compute_efficiency", "memory_efficiency", "attention_efficiency")
LOWEST, HIGHEST = EFFICIENCY_RANGE  # the efficiencies searched: every fit loads with --calibration
COARSE = np.geomspace(LOWEST, HIGHEST, 97)  # 24 a decade, 10% apart
STEP = COARSE[1] / COARSE[0]
ZOOM, ZOOMS = 10, 2  # each finer grid is ZOOM times finer than the last (1%, then 0.1%)...
WINDOW = np.linspace(-2, 2, 4 * ZOOM + 1)  # ...and spans two of its steps either side (exponents of a step)
STARTS = 8  # coarse triples refined
APART = 3  # coarse steps between two of them, along some efficiency
CANDIDATES = 4096  # the best coarse triples they are chosen from
SCAN_STEP = 1.001  # the scan of one efficiency through the best fit
MIN_OVERHEAD_S = 1e-6  # nothing runs in no time; a fit that finds none keeps a microsecond
EQUALLY_GOOD = 1e-3  # relative slack in the squared error within which two fits count as the same
# the share of the KV bytes the GEMM work must leave unexplained to fit attention apart: a sweep at
# contexts 128 and 512 leaves 51%, 128 and 160 11%, one context's 8-step drift 2%
MIN_KV_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class Fit:
    calibration: Calibration
    rms_relative_error: float  # over the samples it was fitted to
    ranges: dict[str, tuple[float, float]]  # each fitted efficiency's span among equally good fits
    held: tuple[str, ...] = ()  # efficiencies these steps cannot identify, kept at the default

    def caveats(self) -> list[str]:
        """What these steps could not pin down, and what was kept: one sentence each."""
        cal = self.calibration
        out = [f"{name}: these steps' contexts are too alike to tell attention's KV read from the GEMMs' "
               f"per-row work; kept {getattr(cal, name):.2f}, the default (a sweep at two contexts, as "
               f"--context 128,512, fits it)" for name in self.held]
        out += [f"{name}: any value in {lo:.2f}..{hi:.2f} fits these steps equally well (they never met "
                f"that roof); kept {getattr(cal, name):.2f}, the nearest to the default"
                for name, (lo, hi) in self.ranges.items() if hi / lo > 1.05]
        return out

    def as_dict(self) -> dict:
        return {"rms_relative_error": self.rms_relative_error,
                "equally_good_ranges": {k: list(v) for k, v in self.ranges.items()},
                "held_at_default": list(self.held)}


def predict(calibration: Calibration, sample: StepSample, peaks: DevicePeaks) -> float:
    return calibration.step_time(sample.cost, peaks)


def _work(samples: list[StepSample]) -> tuple[np.ndarray, ...]:
    """The samples' weight FLOPs, GEMM bytes (all but the KV's), attention FLOPs, KV bytes and seconds."""
    costs = [s.cost for s in samples]
    return (np.array([c.weight_flops for c in costs]), np.array([c.bytes - c.kv_bytes for c in costs]),
            np.array([c.attn_flops for c in costs]), np.array([c.kv_bytes for c in costs]),
            np.array([s.seconds for s in samples]))


def _errors(work: tuple[np.ndarray, ...], peaks: DevicePeaks, compute: np.ndarray, memory: np.ndarray,
            attention: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Squared relative error and best overhead for every (compute, memory, attention) efficiency triple.

    With m and a a sample's GEMM and attention times over its measured time t, its relative error is
    y + overhead / t, y = m + a - 1. Summed over the samples, the squares need sum(y^2) and sum(y / t);
    the only part of those that couples the memory and attention efficiencies is sum(m * a), one
    matrix product per compute efficiency for every (memory, attention) pair.
    """
    weight_flops, matmul_bytes, attn_flops, kv_bytes, seconds = work
    u = 1.0 / seconds
    n, sum_u, sum_uu = len(u), u.sum(), (u * u).sum()
    flop_rate = peaks.peak_flops * compute[:, None, None]
    m = np.maximum(weight_flops * u / flop_rate, matmul_bytes * u / (peaks.peak_bytes_per_s * memory[None, :, None]))
    a = np.maximum(attn_flops * u / flop_rate, kv_bytes * u / (peaks.peak_bytes_per_s * attention[None, :, None]))
    yy = (((m - 2) * m).sum(2)[:, :, None] + ((a - 2) * a).sum(2)[:, None, :]
          + 2 * (m @ a.transpose(0, 2, 1)) + n)  # (compute, memory, attention)
    yu = (m @ u)[:, :, None] + (a @ u)[:, None, :] - sum_u
    overhead = np.clip(-yu / sum_uu, MIN_OVERHEAD_S, MAX_OVERHEAD_S)
    return yy + 2 * overhead * yu + overhead ** 2 * sum_uu, overhead


def _starts(errors: np.ndarray) -> list[tuple[int, ...]]:
    """The best coarse triples, each at least APART coarse steps from the others along some efficiency."""
    flat = errors.ravel()
    best = np.argpartition(flat, min(CANDIDATES, flat.size) - 1)[:CANDIDATES]
    chosen: list[np.ndarray] = []
    for index in best[np.argsort(flat[best])]:
        triple = np.array(np.unravel_index(index, errors.shape))
        if all(np.abs(triple - c).max() >= APART for c in chosen):
            chosen.append(triple)
            if len(chosen) == STARTS:
                break
    return [tuple(int(i) for i in c) for c in chosen]


def _refine(work, peaks: DevicePeaks, centre: list[float], fixed: tuple[bool, ...]) -> tuple[float, list[float]]:
    """The best triple near `centre`, zooming in ZOOMS times (an efficiency marked fixed stays put)."""
    point, step = centre, STEP
    for _ in range(ZOOMS):
        # the zoom stays inside the searched span, so every fit loads again with --calibration
        grids = [np.array([c]) if f else np.unique(np.clip(c * step ** WINDOW, LOWEST, HIGHEST))
                 for c, f in zip(point, fixed)]
        errors, _ = _errors(work, peaks, *grids)
        best = np.unravel_index(int(errors.argmin()), errors.shape)
        point, least, step = [float(g[i]) for g, i in zip(grids, best)], float(errors[best]), step ** (1 / ZOOM)
    return least, point


def _scan(work, peaks: DevicePeaks, point: list[float], axis: int) -> tuple[np.ndarray, np.ndarray]:
    """One efficiency's values over the whole searched span (the point's own among them), and the
    error of each with the others at the point's."""
    low = math.ceil(math.log(LOWEST / point[axis], SCAN_STEP))
    high = math.floor(math.log(HIGHEST / point[axis], SCAN_STEP))
    values = point[axis] * SCAN_STEP ** np.arange(min(low, 0), max(high, 0) + 1)
    grids = [values if k == axis else np.array([v]) for k, v in enumerate(point)]
    errors, _ = _errors(work, peaks, *grids)
    return values, errors.ravel()


def _attention_identified(work: tuple[np.ndarray, ...]) -> bool:
    """Whether the steps' KV bytes vary apart from their GEMM work: at one context each row's KV read
    grows in step with its GEMM bytes and FLOPs, and attention's time trades for theirs. Measured as
    the share of the KV bytes (relative to each step's time) that a constant, the GEMM bytes and the
    GEMM FLOPs leave unexplained."""
    weight_flops, matmul_bytes, _, kv_bytes, seconds = work
    u = 1.0 / seconds
    basis = np.stack([u, matmul_bytes * u, weight_flops * u], axis=1)
    norms, kv_norm = np.linalg.norm(basis, axis=0), np.linalg.norm(kv_bytes * u)
    if not (np.all(norms > 0) and kv_norm > 0):  # steps with no GEMM or no KV work: nothing to tell apart
        return False
    basis /= norms
    kv = kv_bytes * u / kv_norm
    coefficients, *_ = np.linalg.lstsq(basis, kv, rcond=None)
    return bool(np.linalg.norm(kv - basis @ coefficients) > MIN_KV_SHARE)


def _rms_relative_error(calibration: Calibration, samples: list[StepSample], peaks: DevicePeaks) -> float:
    return math.sqrt(sum((predict(calibration, s, peaks) / s.seconds - 1) ** 2 for s in samples) / len(samples))


def fit_calibration(samples: list[StepSample], peaks: DevicePeaks, *, source: str, fitted_on: dict,
                    near: Calibration = DEFAULT) -> Fit:
    if not samples:
        raise ValueError("no measured steps to fit")
    work = _work(samples)
    if not all(np.all(np.isfinite(w)) and np.all(w >= 0) for w in work) or not np.all(work[-1] > 0):
        raise ValueError("the steps' costs and times must be finite, >= 0 and their times > 0")
    targets = [getattr(near, name) for name in EFFICIENCY_NAMES]
    held = () if _attention_identified(work) else ("attention_efficiency",)
    fixed = tuple(name in held for name in EFFICIENCY_NAMES)
    coarse = [np.array([t]) if f else COARSE for t, f in zip(targets, fixed)]
    errors, _ = _errors(work, peaks, *coarse)
    refined = [_refine(work, peaks, [float(g[i]) for g, i in zip(coarse, start)], fixed) for start in _starts(errors)]
    least, point = min(refined, key=lambda r: r[0])
    ranges = {}
    for axis, name in enumerate(EFFICIENCY_NAMES):
        if fixed[axis]:
            continue
        values, scanned = _scan(work, peaks, point, axis)
        ties = values[(scanned <= least * (1 + EQUALLY_GOOD) + 1e-15) | (values == point[axis])]
        point[axis] = float(ties[np.abs(np.log(ties / targets[axis])).argmin()])
        ranges[name] = (float(ties.min()), float(ties.max()))
    _, overhead = _errors(work, peaks, *(np.array([v]) for v in point))
    calibration = Calibration(**dict(zip(EFFICIENCY_NAMES, point)), step_overhead_s=float(overhead.item()),
                              source=source, fitted_on=fitted_on)
    return Fit(calibration, _rms_relative_error(calibration, samples, peaks), ranges, held)
