"""What the panels and the JSON show for one replica (or the aggregate of several), from its window.

Measured: what the server exposes (gauges, counters, histogram buckets). Derived here: rates
(counter deltas / seconds), percentiles (bucket deltas over the window, linear within a bucket),
tokens per step, the roofline point.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batchtop.core_engine.attach.scrape.histogram import Histogram
from batchtop.core_engine.attach.server_point import ModelEstimate, estimated_point, measured_point
from batchtop.core_engine.perf.roofline_point import RooflinePoint
from batchtop.core_engine.attach.scrape.sample import ReplicaSample, Slot
from batchtop.core_engine.attach.scrape.delta import Delta

LATENCIES = ("ttft", "itl", "e2e", "queue_time")
QUANTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    name: str  # the URL, or "aggregate"
    status: str
    reason: str | None
    flavour: str | None = None
    model_name: str | None = None
    running: float | None = None
    waiting: float | None = None
    waiting_by_reason: dict[str, float] = field(default_factory=dict)
    kv_usage: float | None = None
    max_num_seqs: int | None = None
    max_num_seqs_source: str = "unknown"  # "server", "--max-num-seqs" or "unknown"
    num_gpu_blocks: int | None = None
    mode: str | None = None
    rates: dict[str, float] = field(default_factory=dict)  # per second, over the newest interval
    window_rates: dict[str, float] = field(default_factory=dict)  # per second, over the whole window
    tokens_per_step: float | None = None
    latency: dict[str, dict[str, float | None]] = field(default_factory=dict)  # name -> p50/p95/p99/count
    window_s: float | None = None
    finished: dict[str, float] = field(default_factory=dict)  # in the window, by finish reason
    point: RooflinePoint | None = None
    point_note: str | None = None  # why there is no measured point
    resets: int = 0
    ceiling_from: str | None = None  # the server's metric that says max_num_seqs
    token_budget: int | None = None
    slots: tuple[Slot, ...] | None = None
    note: str | None = None
    # the monitor's readings for the panels (readings.py): what its server leaves empty, in the panels'
    # words, and the prefix cache's hit rate over the window
    cannot_fill: dict[str, str] = field(default_factory=dict)
    prefix_cache: str = "not exposed"

    @property
    def success_rate(self) -> float | None:
        total = sum(self.finished.values())
        if total <= 0:
            return None
        return (total - self.finished.get("abort", 0.0) - self.finished.get("error", 0.0)) / total


def latency_table(window: Delta | None) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for key in LATENCIES:
        h = window.histograms.get(key) if window is not None else None
        if h is None:
            continue
        row: dict[str, float | None] = {name: h.quantile(q) for name, q in QUANTILES.items()}
        row["count"] = h.count
        out[key] = row
    return out


def roofline(interval: Delta | None, estimate: ModelEstimate | None, running: float | None,
             lengths: dict[str, Histogram]) -> tuple[RooflinePoint | None, str | None]:
    if interval is None:
        return None, "no interval yet"
    point, note = measured_point(interval)
    if point is None and estimate is not None and (est := estimated_point(interval, estimate, running, lengths)):
        return est, f"estimated from token rates ({note})"
    if point is None and estimate is None and note and "stay 0" in note:
        note += "; give --model for an estimate"
    return point, note


def build_stats(name: str, status: str, reason: str | None, latest: ReplicaSample | None, interval: Delta | None,
                window: Delta | None, *, user_max_num_seqs: int | None, estimate: ModelEstimate | None,
                resets: int = 0) -> ReplicaStats:
    """One replica's numbers; `latest` is its newest good sample (None: never scraped)."""
    if latest is None:
        return ReplicaStats(name, status, reason, resets=resets)
    max_seqs, source = latest.max_num_seqs, "server"
    if max_seqs is None:
        max_seqs, source = user_max_num_seqs, "--max-num-seqs" if user_max_num_seqs else "unknown"
    steps = interval.histograms.get("iteration_tokens") if interval is not None else None
    point, note = roofline(interval, estimate, latest.running, latest.histograms)
    rates = dict(interval.per_s) if interval is not None else {}
    per_step = steps.mean if steps is not None else None
    if steps is not None:
        rates["steps"] = steps.count / interval.dt
    elif interval is not None and interval.totals.get("steps", 0) > 0:  # a step counter, no histogram
        tokens = interval.totals.get("prompt_tokens", 0.0) + interval.totals.get("generation_tokens", 0.0)
        per_step = tokens / interval.totals["steps"]
    return ReplicaStats(
        name, status, reason, latest.flavour, latest.model_name, latest.running, latest.waiting,
        dict(latest.waiting_by_reason), latest.kv_usage, max_seqs, source, latest.num_gpu_blocks, latest.mode,
        rates, dict(window.per_s) if window is not None else {}, per_step, latency_table(window),
        window.dt if window is not None else None, dict(window.success) if window is not None else {},
        point, note, resets, latest.ceiling_from if source == "server" else None, latest.token_budget,
        latest.slots, latest.note)
