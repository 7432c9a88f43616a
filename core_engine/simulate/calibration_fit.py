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

Every efficiency is searched up to 1 only: a kernel does not beat the device's roofs. Where the best
fit sits at 1 and would go higher, the fit says so (a caveat): either some step ran faster than its
work at the roofs allows (caches, or a roof measured low), or the fit traded the constant terms
against the weights' streaming time, both nearly constant across a decode sweep.

The roofs it fits against are the device's measured ones raised to what the steps did (seen_roofs): a
roof measured in a busy minute would otherwise hold every efficiency at 1 and the model slow. The
calibration keeps them, and a what-if run of this device times its steps by them.

The step overhead and the per-layer latency are two linear terms, fitted in closed form (least squares,
both >= 0) for each triple. Steps of one model have one depth, and there the two are one constant:
the fit keeps at most the default's overhead of it and charges the rest to the layers, and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.simulate.calibration import (DEFAULT, EFFICIENCY_RANGE, FITTED_RANGE, MAX_LAYER_LATENCY_S,
                                                       MAX_OVERHEAD_S, Calibration)
from batchtop.core_engine.perf.decode_sweep import StepSample
from batchtop.core_engine.simulate.seen_roofs import seen_roofs, with_raise_note

EFFICIENCY_NAMES = ("compute_efficiency", "memory_efficiency", "attention_efficiency")
LOWEST, HIGHEST = FITTED_RANGE  # the efficiencies searched: none above the device's roofs
COARSE = np.geomspace(LOWEST, HIGHEST, 49)  # 24 a decade, 10% apart
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
    bounded: tuple[str, ...] = ()  # efficiencies held at 1 that the steps alone would put higher
    notes: tuple[str, ...] = ()  # why each was held at 1, and how overhead and latency were split

    def caveats(self) -> list[str]:
        """What these steps could not pin down, and what was kept: one sentence each."""
        cal = self.calibration
        out = [f"{name}: these steps' contexts are too alike to tell attention's KV read from the GEMMs' "
               f"per-row work; kept {getattr(cal, name):.2f}, the default (a sweep at two contexts, as "
               f"--context 128,512, fits it)" for name in self.held]
        out += [f"{name}: any value in {lo:.2f}..{hi:.2f} fits these steps equally well (they never met "
                f"that roof); kept {getattr(cal, name):.2f}, the nearest to the default"
                for name, (lo, hi) in self.ranges.items() if hi / lo > 1.05 and name not in self.bounded]
        return out + list(self.notes)

    def as_dict(self) -> dict:
        return {"rms_relative_error": self.rms_relative_error,
                "equally_good_ranges": {k: list(v) for k, v in self.ranges.items()},
                "held_at_default": list(self.held), "held_at_bound": list(self.bounded)}


def predict(calibration: Calibration, sample: StepSample, peaks: DevicePeaks, layers: int = 0) -> float:
    return calibration.step_time(sample.cost, peaks, layers)


def _work(samples: list[StepSample], depth: np.ndarray) -> tuple[np.ndarray, ...]:
    """The samples' weight FLOPs, GEMM bytes (all but the KV's), attention FLOPs, KV bytes, seconds and
    decoder layers."""
    costs = [s.cost for s in samples]
    return (np.array([c.weight_flops for c in costs]), np.array([c.bytes - c.kv_bytes for c in costs]),
            np.array([c.attn_flops for c in costs]), np.array([c.kv_bytes for c in costs]),
            np.array([s.seconds for s in samples]), depth)


def _depths_differ(depth: np.ndarray) -> bool:
    return bool(depth.min() != depth.max())


def _errors(work: tuple[np.ndarray, ...], peaks: DevicePeaks, compute: np.ndarray, memory: np.ndarray,
            attention: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Squared relative error, best overhead and best per-layer latency for every (compute, memory,
    attention) efficiency triple.

    With m and a a sample's GEMM and attention times over its measured time t, u = 1 / t and v its
    layers over t, its relative error is y + overhead * u + latency * v, y = m + a - 1. Summed over the
    samples, the squares need sum(y^2), sum(y * u) and sum(y * v); the only part of those that couples
    the memory and attention efficiencies is sum(m * a), one matrix product per compute efficiency for
    every (memory, attention) pair. Steps of one depth fit one constant (v is a multiple of u): it is
    returned as the overhead, the latency 0, and fit_calibration splits it.
    """
    weight_flops, matmul_bytes, attn_flops, kv_bytes, seconds, depth = work
    u = 1.0 / seconds
    n, uu = len(u), (u * u).sum()
    flop_rate = peaks.peak_flops * compute[:, None, None]
    m = np.maximum(weight_flops * u / flop_rate, matmul_bytes * u / (peaks.peak_bytes_per_s * memory[None, :, None]))
    a = np.maximum(attn_flops * u / flop_rate, kv_bytes * u / (peaks.peak_bytes_per_s * attention[None, :, None]))
    yy = (((m - 2) * m).sum(2)[:, :, None] + ((a - 2) * a).sum(2)[:, None, :]
          + 2 * (m @ a.transpose(0, 2, 1)) + n)  # (compute, memory, attention)

    def y_dot(w: np.ndarray) -> np.ndarray:
        return (m @ w)[:, :, None] + (a @ w)[:, None, :] - w.sum()

    yu = y_dot(u)
    if not _depths_differ(depth):
        overhead = np.clip(-yu / uu, MIN_OVERHEAD_S, MAX_OVERHEAD_S)
        return yy + 2 * overhead * yu + overhead ** 2 * uu, overhead, np.zeros_like(overhead)
    v = depth * u
    yv, uv, vv = y_dot(v), (u * v).sum(), (v * v).sum()

    def error(o, lat):
        return yy + 2 * o * yu + 2 * lat * yv + o * o * uu + 2 * o * lat * uv + lat * lat * vv

    det = uu * vv - uv * uv  # > 0: the depths differ
    free_o, free_l = (uv * yv - vv * yu) / det, (uv * yu - uu * yv) / det
    # a bound that binds: the optimum lies on that edge, the other term fitted alone along it
    edge_o = (np.clip(-yu / uu, MIN_OVERHEAD_S, MAX_OVERHEAD_S), np.zeros_like(yu))
    edge_l = (np.full_like(yu, MIN_OVERHEAD_S), np.clip(-(yv + MIN_OVERHEAD_S * uv) / vv, 0, MAX_LAYER_LATENCY_S))
    e_o, e_l = error(*edge_o), error(*edge_l)
    overhead, latency, least = (np.where(e_o <= e_l, x, y) for x, y in zip((*edge_o, e_o), (*edge_l, e_l)))
    inside = ((free_o >= MIN_OVERHEAD_S) & (free_o <= MAX_OVERHEAD_S) & (free_l >= 0)
              & (free_l <= MAX_LAYER_LATENCY_S))
    return (np.where(inside, error(free_o, free_l), least), np.where(inside, free_o, overhead),
            np.where(inside, free_l, latency))


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
        errors, *_ = _errors(work, peaks, *grids)
        best = np.unravel_index(int(errors.argmin()), errors.shape)
        point, least, step = [float(g[i]) for g, i in zip(grids, best)], float(errors[best]), step ** (1 / ZOOM)
    return least, point


def _scan(work, peaks: DevicePeaks, point: list[float], axis: int, span: tuple[float, float] = FITTED_RANGE
          ) -> tuple[np.ndarray, np.ndarray]:
    """One efficiency's values over the whole searched span (the point's own among them), and the
    error of each with the others at the point's."""
    low = math.ceil(math.log(span[0] / point[axis], SCAN_STEP))
    high = math.floor(math.log(span[1] / point[axis], SCAN_STEP))
    values = point[axis] * SCAN_STEP ** np.arange(min(low, 0), max(high, 0) + 1)
    grids = [values if k == axis else np.array([v]) for k, v in enumerate(point)]
    errors, *_ = _errors(work, peaks, *grids)
    return values, errors.ravel()


def _attention_identified(work: tuple[np.ndarray, ...]) -> bool:
    """Whether the steps' KV bytes vary apart from their GEMM work: at one context each row's KV read
    grows in step with its GEMM bytes and FLOPs, and attention's time trades for theirs. Measured as
    the share of the KV bytes (relative to each step's time) that a constant, the GEMM bytes and the
    GEMM FLOPs leave unexplained."""
    weight_flops, matmul_bytes, _, kv_bytes, seconds, depth = work
    u = 1.0 / seconds
    basis = np.stack([u, matmul_bytes * u, weight_flops * u] + ([depth * u] if _depths_differ(depth) else []), axis=1)
    norms, kv_norm = np.linalg.norm(basis, axis=0), np.linalg.norm(kv_bytes * u)
    if not (np.all(norms > 0) and kv_norm > 0):  # steps with no GEMM or no KV work: nothing to tell apart
        return False
    basis /= norms
    kv = kv_bytes * u / kv_norm
    coefficients, *_ = np.linalg.lstsq(basis, kv, rcond=None)
    return bool(np.linalg.norm(kv - basis @ coefficients) > MIN_KV_SHARE)


def _rms_relative_error(calibration: Calibration, samples: list[StepSample], peaks: DevicePeaks,
                        depth: np.ndarray) -> float:
    return math.sqrt(sum((predict(calibration, s, peaks, int(d)) / s.seconds - 1) ** 2
                         for s, d in zip(samples, depth)) / len(samples))


ROOFS = {"compute_efficiency": "FLOP rate", "memory_efficiency": "bandwidth", "attention_efficiency": "bandwidth"}


def _bound_notes(work, peaks: DevicePeaks, point: list[float], least: float,
                 fixed: tuple[bool, ...]) -> tuple[tuple[str, ...], list[str]]:
    """The efficiencies held at 1 that the steps alone would put higher, and why, one sentence each."""
    weight_flops, matmul_bytes, attn_flops, kv_bytes, seconds, _ = work
    measured = not peaks.source.startswith("datasheet")
    roofs = "measured" if measured else "datasheet"
    flops, bandwidth = peaks.peak_flops, peaks.peak_bytes_per_s  # the roofline time at efficiency 1
    at_roofs = (np.maximum(weight_flops / flops, matmul_bytes / bandwidth)
                + np.maximum(attn_flops / flops, kv_bytes / bandwidth))
    beaten = bool(np.any(at_roofs > seconds))
    bounded, notes = [], []
    for axis, name in enumerate(EFFICIENCY_NAMES):
        if fixed[axis] or point[axis] < HIGHEST:
            continue
        values, errors = _scan(work, peaks, point, axis, (HIGHEST, EFFICIENCY_RANGE[1]))
        if errors.min() >= least * (1 - EQUALLY_GOOD) - 1e-15:
            continue  # 1 fits as well as anything above it: not a bound that binds
        bounded.append(name)
        label = name.replace("_", " ")
        if beaten:
            why = (f"these steps ran faster than the {roofs} {ROOFS[name]} allows "
                   + ("(caches, or a roof measured low): re-measure the roofs" if measured else
                      "(a datasheet peak this device does not reach, or the steps' bytes counted high)"))
        else:
            why = (f"these steps fit better above it ({values[errors.argmin()]:.2f}, the others as fitted), trading "
                   f"the weights' streaming time "
                   f"against the per-step and per-layer constants (all nearly constant across a decode sweep); "
                   f"each step took longer than its work at the {roofs} roofs")
        notes.append(f"{label} held at 1.00: {why}")
    return tuple(bounded), notes


def _split_constant(constant: float, layers: int, near: Calibration) -> tuple[float, float, str | None]:
    """One depth's per-step constant as (overhead, per-layer latency, the caveat): at most the default's
    overhead stays per step, the rest goes to the layers."""
    if layers <= 0:
        return constant, 0.0, None
    overhead = min(constant, max(near.step_overhead_s, MIN_OVERHEAD_S))
    latency = (constant - overhead) / layers
    return overhead, latency, (
        f"step overhead and layer latency: these steps all ran one model depth ({layers} layers), so the two "
        f"are one constant here ({1e3 * constant:.2f} ms a step); kept {1e3 * overhead:.2f} ms of it per step "
        f"(at most the default's) and charged {1e6 * latency:.1f} us to each layer (steps of models of two "
        f"depths fit them apart)")


def _search(work, peaks: DevicePeaks, targets: list[float], fixed: tuple[bool, ...]
            ) -> tuple[float, list[float], dict[str, tuple[float, float]]]:
    """The best triple (each efficiency nearest its target among equally good ones), its error, and each
    fitted efficiency's span among equally good fits."""
    coarse = [np.array([t]) if f else COARSE for t, f in zip(targets, fixed)]
    errors, *_ = _errors(work, peaks, *coarse)
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
    least = float(_errors(work, peaks, *(np.array([v]) for v in point))[0].item())
    return least, point, ranges


def fit_calibration(samples: list[StepSample], peaks: DevicePeaks, *, source: str, fitted_on: dict,
                    near: Calibration = DEFAULT, layers: int | list[int] = 0) -> Fit:
    """layers: the decoder layers of the model each sample ran (one number for all); 0 fits no
    per-layer latency. Measured roofs are raised to what the steps did (seen_roofs) before the fit."""
    if not samples:
        raise ValueError("no measured steps to fit")
    depth = np.array([layers] * len(samples) if isinstance(layers, int) else layers, dtype=float)
    if depth.shape != (len(samples),) or not np.all(depth >= 0) or not np.all(depth == np.round(depth)):
        raise ValueError("layers must be one whole number >= 0, or one for each step")
    work = _work(samples, depth)
    if not all(np.all(np.isfinite(w)) and np.all(w >= 0) for w in work) or not np.all(work[4] > 0):
        raise ValueError("the steps' costs and times must be finite, >= 0 and their times > 0")
    targets = [min(getattr(near, name), HIGHEST) for name in EFFICIENCY_NAMES]
    held = () if _attention_identified(work) else ("attention_efficiency",)
    fixed = tuple(name in held for name in EFFICIENCY_NAMES)
    roofs, raised = with_raise_note(peaks, seen_roofs(samples, peaks))
    least, point, ranges = _search(work, roofs, targets, fixed)
    least, overhead, latency = (float(x.item()) for x in _errors(work, roofs, *(np.array([v]) for v in point)))
    bounded, notes = _bound_notes(work, roofs, point, least, fixed)
    notes = [raised, *notes] if raised else notes
    if not _depths_differ(depth):
        overhead, latency, split = _split_constant(overhead, int(depth[0]), near)
        notes += [split] if split else []
    calibration = Calibration(**dict(zip(EFFICIENCY_NAMES, point)), step_overhead_s=overhead, layer_latency_s=latency,
                              source=source, fitted_on=fitted_on, roofs=roofs)
    return Fit(calibration, _rms_relative_error(calibration, samples, roofs, depth), ranges, held, bounded, tuple(notes))
