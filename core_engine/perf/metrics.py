"""Metrics folded from step snapshots alone, so a live run and a replayed trace give the same numbers."""

from __future__ import annotations

import math
from collections import deque

from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.engine.snapshot import Counters, FinishedRequest, SlotState, StepSnapshot

METRICS_SCHEMA = "batchtop.metrics/1"


def percentiles(values: list[float], qs: tuple[int, ...] = (50, 90, 99)) -> dict[str, float | None]:
    """Linear-interpolated percentiles (numpy's default); None for an empty list."""
    out: dict[str, float | None] = {}
    data = sorted(values)
    for q in qs:
        if not data:
            out[f"p{q}"] = None
            continue
        k = (len(data) - 1) * q / 100
        lo = int(k)
        hi = min(lo + 1, len(data) - 1)
        out[f"p{q}"] = data[lo] + (data[hi] - data[lo]) * (k - lo)
    out["mean"] = sum(data) / len(data) if data else None
    return out


def finite(value):
    """The document with every NaN or infinity (a step that took no finite time, a config value
    read as NaN) replaced by None: JSON has no such numbers, and a run's metrics must always write."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    if isinstance(value, tuple):
        return tuple(finite(v) for v in value)
    return value


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class MetricsCollector:
    """Accumulates per-step facts; summary() renders the batchtop.metrics/1 document."""

    def __init__(self) -> None:
        self.finished: list[FinishedRequest] = []
        self.last: StepSnapshot | None = None
        self.first_step_start: float | None = None  # run time when the first forward step began
        self.steps = 0
        self.capacity_slot_steps = 0  # sum over steps of the slots shown (see observe)
        self.slot_steps = {state: 0 for state in SlotState}  # shares of capacity; they sum to it
        self.used_block_sum = 0
        self.peak_used_blocks = 0
        self.step_times: list[float] = []
        self.overhead_time = 0.0  # schedule + input building
        self.batch_sizes_sum = 0
        self.max_batch = 0
        # per step kind: (intensity, achieved FLOP/s, achieved bytes/s) over the forward's time
        self.roofline_points: dict[str, list[tuple[float, float, float]]] = {"decode": [], "prefill": []}

    def observe(self, snap: StepSnapshot) -> None:
        self.last = snap
        if not snap.is_step:
            return
        if self.first_step_start is None:
            self.first_step_start = snap.t - snap.step_time_s
        self.steps += 1
        self.capacity_slot_steps += len(snap.slots)  # max_num_seqs, or more while a lowered cap drains
        for state in snap.slot_states():
            self.slot_steps[state] += 1
        used = snap.num_used_blocks
        self.used_block_sum += used
        self.peak_used_blocks = max(self.peak_used_blocks, used)
        self.step_times.append(snap.step_time_s)
        self.overhead_time += snap.schedule_s + snap.prepare_s
        self.batch_sizes_sum += snap.num_seqs
        self.max_batch = max(self.max_batch, snap.num_seqs)
        self.finished.extend(snap.finished)
        if snap.forward_s > 0 and snap.cost.bytes > 0:
            kind = "decode" if snap.num_prefill_tokens == 0 else "prefill"
            self.roofline_points[kind].append((snap.cost.intensity, snap.cost.flops / snap.forward_s,
                                               snap.cost.bytes / snap.forward_s))

    def share(self, state: SlotState) -> float:
        return self.slot_steps[state] / self.capacity_slot_steps if self.capacity_slot_steps else 0.0

    def finish_reasons(self) -> dict[str, int]:
        """Completed requests by why they ended: length (max_tokens) or stop (an EOS token)."""
        counts = {"length": 0, "stop": 0}
        for f in self.finished:
            counts[f.finish_reason] = counts.get(f.finish_reason, 0) + 1
        return counts

    def roofline(self, peaks: DevicePeaks, roofs: dict | None = None) -> dict:
        """Where decode and prefill steps sat against this device's roofs, on average: the roofs the run
        ended with (raised_roofs.py); roofs: where each came from (RoofRaiser.as_dict)."""
        out: dict = {"device_name": peaks.device_name, "peak_flops": peaks.peak_flops,
                     "peak_bytes_per_s": peaks.peak_bytes_per_s, "ridge_flop_per_byte": peaks.ridge_flop_per_byte,
                     "peaks_source": peaks.source}
        if roofs is not None:
            out["roofs"] = roofs
        for kind, points in self.roofline_points.items():
            n = len(points)
            out[kind] = {
                "steps": n,
                "intensity_mean": sum(p[0] for p in points) / n if n else None,
                "achieved_flops_mean": sum(p[1] for p in points) / n if n else None,
                "achieved_bytes_per_s_mean": sum(p[2] for p in points) / n if n else None,
                "fraction_of_roof_mean": _mean(fractions := [p[1] / peaks.roof(p[0]) for p in points
                                                             if peaks.roof(p[0]) > 0]),
                "fraction_of_roof_max": max(fractions, default=None),
            }
        return out

    def summary(self, config: dict, *, complete: bool = True, workload: dict | None = None,
                peaks: DevicePeaks | None = None, roofs: dict | None = None) -> dict:
        last = self.last
        counters = last.counters if last is not None else None
        wall = last.t if last is not None else 0.0
        generated = counters.generated_tokens if counters else 0
        num_blocks = last.num_blocks if last is not None else config.get("num_kv_blocks", 0)
        total_step_time = sum(self.step_times)
        return finite({
            "schema": METRICS_SCHEMA,
            "complete": complete,
            "mode": last.mode if last is not None else config.get("mode"),
            "config": config,
            "workload": workload or {},
            "requests": {
                "submitted": counters.submitted if counters else 0,
                "completed": counters.completed if counters else 0,
                "rejected": counters.rejected if counters else 0,
            },
            "finish_reasons": self.finish_reasons(),
            "tokens": {
                "prompt": counters.prompt_tokens if counters else 0,
                "generated": generated,
                "computed": counters.computed_tokens if counters else 0,
                "prompt_padding": counters.prompt_padding_tokens if counters else 0,
                "cached": counters.cached_tokens if counters else 0,
            },
            "prefix_cache": prefix_cache(counters),
            "steps": self.steps,
            "wall_time_s": wall,
            "throughput_tok_s": generated / wall if wall > 0 else 0.0,
            "ttft_s": percentiles([f.ttft_s for f in self.finished if f.ttft_s is not None]),
            "tpot_s": percentiles([f.tpot_s for f in self.finished if f.tpot_s is not None]),
            "e2e_s": percentiles([f.e2e_s for f in self.finished]),
            "slot_utilization": self.share(SlotState.WORKING),
            "padding_share": self.share(SlotState.PADDING),
            "bubble_share": self.share(SlotState.BUBBLE),
            "free_share": self.share(SlotState.FREE),
            "prompt_padding_share": (counters.prompt_padding_tokens / counters.computed_tokens
                                     if counters and counters.computed_tokens else 0.0),
            "batch_size": {"mean": self.batch_sizes_sum / self.steps if self.steps else 0.0,
                           "max": self.max_batch},
            "step_time_s": percentiles(self.step_times),
            "scheduler_overhead_share": self.overhead_time / total_step_time if total_step_time else 0.0,
            "kv": {
                "num_blocks": num_blocks,
                "block_size": config.get("block_size"),
                "peak_used_blocks": self.peak_used_blocks,
                "mean_utilization": self.used_block_sum / (self.steps * num_blocks) if self.steps and num_blocks else 0.0,
                "free_blocks_at_end": last.num_free_blocks if last is not None else num_blocks,
            },
            "preemptions": counters.preemptions if counters else 0,
            **({"roofline": self.roofline(peaks, roofs)} if peaks is not None else {}),
        })


def prefix_cache(counters: Counters | None) -> dict:
    """vLLM's prefix-cache counters: prompt tokens new requests looked up at admission, the tokens found
    cached, and their ratio (None before any lookup, or with caching off)."""
    queries = counters.prefix_queries if counters else 0
    hits = counters.prefix_hits if counters else 0
    return {"queries": queries, "hits": hits, "hit_rate": hits / queries if queries else None}


class RateWindow:
    """Tokens per second over the last `seconds` of steps (the dashboard's 'now' throughput)."""

    def __init__(self, seconds: float = 2.0) -> None:
        self.seconds = seconds
        self._events: deque[tuple[float, int]] = deque()

    def add(self, t: float, tokens: int) -> None:
        self._events.append((t, tokens))
        while self._events and self._events[0][0] < t - self.seconds:
            self._events.popleft()

    def rate(self) -> float:
        if len(self._events) < 2:
            return 0.0
        span = self._events[-1][0] - self._events[0][0]
        return sum(n for _, n in list(self._events)[1:]) / span if span > 0 else 0.0
