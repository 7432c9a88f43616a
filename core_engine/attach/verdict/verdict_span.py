"""The main server's recent ticks summed up for the verdict: how often running sat at its ceiling and
requests waited (and why), how full the KV pool was, where the steps' tokens piled up, the preemptions
and finished requests, and how the requests arrive (bursts.py reads a client that sends batches).

Every number is a share or a mean over several scrapes, never one scrape's reading, so a single noisy
scrape moves it by a scrape's worth and no more (the tracker then asks several ticks to agree).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batchtop.core_engine.attach.verdict.bursts import BarrierReading
from batchtop.core_engine.attach.scrape.histogram import Histogram, merge_all
from batchtop.core_engine.attach.history import HistoryPoint
from batchtop.core_engine.attach.streams.step_log import StepSpan, merge_spans

SPAN_S = 5.0  # what the verdict reads: the last 5 s of scrapes ...
SPAN_POINTS = 5  # ... and never fewer than 5 of them, whatever the interval
PATTERN_S = 60.0  # the arrival pattern: the last minute, or at least the last 20 scrapes
PATTERN_POINTS = 20
PLATEAU_SHARE = 0.6  # an inferred ceiling: running held at its peak in 60% of the scrapes that waited
PLATEAU_MIN = 3


def _empty(p: HistoryPoint) -> bool:
    return not p.running and not p.waiting


def recent(history: tuple[HistoryPoint, ...], seconds: float, at_least: int) -> list[HistoryPoint]:
    """The fresh points (the server answered) of the last `seconds`, or the last `at_least` of them;
    once a load arrives, the empty scrapes before it are not part of what bounds it."""
    fresh = [p for p in history if p.dt is not None and p.running is not None]
    if not fresh:
        return []
    newest = fresh[-1].t
    inside = [p for p in fresh if p.t >= newest - seconds]
    points = inside if len(inside) >= at_least else fresh[-at_least:]
    while len(points) > 1 and _empty(points[0]) and not _empty(points[-1]):
        points = points[1:]
    return points


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass(frozen=True, slots=True)
class Span:
    scrapes: int
    seconds: float
    flavour: str | None
    running_mean: float
    running_max: float
    waiting_mean: float
    waiting_max: float
    waiting_share: float  # share of the scrapes in which at least one request waited
    reasons: dict[str, float]  # waiting by reason, mean over the scrapes that say it
    kv_mean: float | None
    kv_max: float | None
    ceiling: int | None
    ceiling_source: str  # the server's metric, "--max-num-seqs", "inferred" or "unknown"
    at_ceiling_share: float | None  # share of scrapes with running at (or above) the ceiling
    budget: int | None
    steps: Histogram | None  # tokens per step, every step of the span
    preemptions: float | None  # over the span; None: not exposed
    totals: dict[str, float] = field(default_factory=dict)  # counter growth over the span
    finished: float | None = None  # requests finished over the span; None: not exposed
    logged: StepSpan | None = None  # every step the server logged in the span (--vllm-log)

    def rate(self, key: str) -> float | None:
        return self.totals[key] / self.seconds if key in self.totals and self.seconds > 0 else None


def inferred_ceiling(points: list[HistoryPoint]) -> int | None:
    """The plateau running holds while requests wait: the ceiling a server that does not say it has."""
    waited = [p.running for p in points if (p.waiting or 0) >= 1 and p.running is not None]
    if len(waited) < PLATEAU_MIN:
        return None
    peak = max(waited)
    at_peak = sum(r == peak for r in waited)
    return int(peak) if peak >= 1 and at_peak >= PLATEAU_MIN and at_peak >= PLATEAU_SHARE * len(waited) else None


def summarize(points: list[HistoryPoint], plateau: int | None = None) -> Span | None:
    """The span's numbers; `plateau` is a ceiling inferred earlier, kept while this span shows none
    (the queue drained for a moment: the ceiling did not go away)."""
    if not points:
        return None
    running = [p.running or 0.0 for p in points]
    waiting = [p.waiting or 0.0 for p in points]
    reasons: dict[str, list[float]] = {}
    for p in points:
        for k, v in p.reasons.items():
            reasons.setdefault(k, []).append(v)
    kv = [p.kv_usage for p in points if p.kv_usage is not None]
    ceiling, source = points[-1].ceiling, points[-1].ceiling_source
    if not ceiling:
        ceiling = inferred_ceiling(points) or plateau
        source = "inferred" if ceiling else "unknown"
    totals: dict[str, float] = {}
    for p in points:
        for k, v in p.totals.items():
            totals[k] = totals.get(k, 0.0) + v
    finished = [p.finished for p in points if p.finished is not None]
    steps = [p.steps for p in points if p.steps is not None]
    return Span(
        len(points), sum(p.dt or 0.0 for p in points), points[-1].flavour, sum(running) / len(running),
        max(running), sum(waiting) / len(waiting), max(waiting), sum(w >= 1 for w in waiting) / len(waiting),
        {k: sum(v) / len(v) for k, v in reasons.items()}, _mean(kv), max(kv) if kv else None, ceiling, source,
        sum(r >= ceiling for r in running) / len(running) if ceiling else None, points[-1].budget,
        merge_all(steps) if len(steps) == len(points) else None,
        totals.get("preemptions") if any("preemptions" in p.totals for p in points) else None,
        totals, sum(finished) if finished else None, merge_spans([p.logged for p in points]))


def step_buckets(h: Histogram) -> list[tuple[float, float, float]]:
    """(lower, upper, steps) of each bucket, not cumulative."""
    out, lower, before = [], 0.0, 0.0
    for bound, cumulative in zip(h.bounds, h.counts):
        out.append((lower, bound, cumulative - before))
        lower, before = bound, cumulative
    return out


def top_bucket(h: Histogram) -> tuple[float, float, float] | None:
    """(lower, upper, share of all steps) of the highest bucket any step fell in."""
    buckets = [b for b in step_buckets(h) if b[2] > 0]
    if not buckets or h.count <= 0:
        return None
    lower, upper, steps = buckets[-1]
    return lower, upper, steps / h.count


def share_at_budget(h: Histogram, budget: int) -> float | None:
    """Share of the steps in the bucket that holds the budget (or above it: a budget is a ceiling)."""
    if h.count <= 0:
        return None
    lower, _ = h.bucket_of(budget)
    return sum(n for lo, _, n in step_buckets(h) if lo >= lower) / h.count


@dataclass(frozen=True, slots=True)
class Pattern:
    """How the requests arrive: running's peak and lowest point over the last minute, how bunched the
    completions are, and the barrier reading (bursts.py) when the client sends them in batches."""

    seconds: float
    peak: float
    trough: float
    burst_share: float | None = None  # share of the completions (request_success_total) in the busiest
    # quarter of the scrapes: near 1 when whole batches finish together, near 0.25 for a steady stream
    barrier: BarrierReading | None = None


def burst_share(points: list[HistoryPoint]) -> float | None:
    finished = sorted((p.finished or 0.0 for p in points), reverse=True)
    total = sum(finished)
    if total <= 0 or not any(p.finished is not None for p in points):
        return None
    return sum(finished[:max(1, len(finished) // 4)]) / total


def pattern(points: list[HistoryPoint], barrier: BarrierReading | None = None) -> Pattern | None:
    running = [p.running or 0.0 for p in points]
    if len(running) < 3:
        return None
    return Pattern(points[-1].t - points[0].t, max(running), min(running), burst_share(points), barrier)
