"""The main server's signals, one point per tick: what the strip charts draw and the verdict reads."""

from __future__ import annotations

from dataclasses import dataclass, field

from batchtop.core_engine.attach.scrape.histogram import Histogram
from batchtop.core_engine.perf.roofline_point import RooflinePoint
from batchtop.core_engine.attach.stats import ReplicaStats
from batchtop.core_engine.attach.scrape.delta import Delta
from batchtop.core_engine.attach.streams.step_log import StepSpan


@dataclass(frozen=True, slots=True)
class HistoryPoint:
    """One tick of the main server (the one replica, or the aggregate): its gauges, and what changed
    in the interval that ended at this tick (dt None: no fresh interval, the server did not answer)."""

    t: float
    running: float | None
    waiting: float | None
    gen_tok_s: float | None
    point: RooflinePoint | None
    flavour: str | None = None
    reasons: dict[str, float] = field(default_factory=dict)  # waiting by reason
    kv_usage: float | None = None
    ceiling: int | None = None
    ceiling_source: str = "unknown"  # the server's metric, "--max-num-seqs" or "unknown"
    budget: int | None = None
    dt: float | None = None
    totals: dict[str, float] = field(default_factory=dict)  # counter growth over the interval
    finished: float | None = None  # requests finished in the interval (None: not exposed)
    steps: Histogram | None = None  # tokens per step over the interval
    logged: StepSpan | None = None  # the steps the server logged in the interval (--vllm-log)


def history_point(t: float, m: ReplicaStats, d: Delta | None, logged: StepSpan | None = None) -> HistoryPoint:
    """The point of a tick; its ceiling source names the server's metric when the server says it."""
    finished = sum(d.success.values()) if d is not None and d.success else None
    source = m.ceiling_from or m.max_num_seqs_source if m.max_num_seqs_source == "server" else m.max_num_seqs_source
    return HistoryPoint(t, m.running, m.waiting, m.rates.get("generation_tokens"), m.point, m.flavour,
                        dict(m.waiting_by_reason), m.kv_usage, m.max_num_seqs, source,
                        m.token_budget, d.dt if d is not None else None, dict(d.totals) if d is not None else {},
                        finished, d.histograms.get("iteration_tokens") if d is not None else None, logged)
