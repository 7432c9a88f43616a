"""Number formats the attach panels share: unknown values are "–", never 0."""

from __future__ import annotations

from batchtop.core_engine.attach.stats import ReplicaStats

MEASURED_NOTE = "measured: gauges, counters, histogram buckets · derived: rates, percentiles, roofline"


def num(value: float | None, fmt: str = "{:.0f}") -> str:
    return "–" if value is None else fmt.format(value)


def pct(share: float | None) -> str:
    return "–" if share is None else f"{100 * share:.0f}%"


def secs(value: float | None) -> str:
    """Latencies: ms below a second, seconds above."""
    if value is None:
        return "–"
    return f"{value * 1e3:.0f}ms" if value < 1 else f"{value:.2f}s"


def latency(s: ReplicaStats, name: str, q: str) -> float | None:
    return s.latency.get(name, {}).get(q)


def short_url(url: str) -> str:
    text = url.split("://", 1)[-1]
    return text[:-len("/metrics")] if text.endswith("/metrics") else text
