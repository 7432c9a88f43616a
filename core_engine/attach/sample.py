"""One scrape of one replica: the Prometheus text parsed (by prometheus_client's own parser) into the
numbers attach shows, summed over the label sets a server splits them by (engines, ranks, models).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from batchtop.core_engine.attach.flavours import (BATCHTOP_MAX_NUM_SEQS, BATCHTOP_MODE, NAMES, MetricNames,
                                                  detect_flavour)
from batchtop.core_engine.attach.histogram import Histogram

COUNTERS = ("prompt_tokens", "generation_tokens", "preemptions", "flops", "read_bytes", "write_bytes",
            "prefix_queries", "prefix_hits")
HISTOGRAMS = ("ttft", "itl", "e2e", "queue_time", "iteration_tokens", "prompt_len", "generation_len")


class BadExposition(ValueError):
    """Not Prometheus text, or Prometheus text without any vLLM, SGLang or batchtop metric."""


@dataclass(frozen=True, slots=True)
class ReplicaSample:
    t: float  # seconds on the monitor's clock when the scrape answered
    flavour: str
    model_name: str | None = None
    running: float | None = None
    waiting: float | None = None
    waiting_by_reason: dict[str, float] = field(default_factory=dict)
    kv_usage: float | None = None  # 0..1
    counters: dict[str, float] = field(default_factory=dict)  # COUNTERS that the server exposes
    success: dict[str, float] = field(default_factory=dict)  # finished requests by finish reason
    histograms: dict[str, Histogram] = field(default_factory=dict)
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    kv_capacity_tokens: float | None = None
    max_num_seqs: int | None = None  # batchtop serve says; vLLM and SGLang do not expose it
    mode: str | None = None  # batchtop serve's batching policy

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__slots__ if k != "histograms"}
        out["histograms"] = {k: h.as_dict() for k, h in self.histograms.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict) -> ReplicaSample:
        fields = {k: data.get(k) for k in cls.__slots__ if k != "histograms"}
        for k in ("waiting_by_reason", "counters", "success"):
            fields[k] = dict(fields[k] or {})
        hists = {k: Histogram.from_dict(h) for k, h in (data.get("histograms") or {}).items()}
        return cls(**fields, histograms=hists)


class _Samples:
    """Sample name -> [(labels, value)], from the parsed families."""

    def __init__(self, text: str) -> None:
        self.by_name: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        try:
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    value = float(s.value)
                    if math.isfinite(value):  # Prometheus text may say NaN or +Inf: shown as not exposed,
                        self.by_name[s.name].append((s.labels, value))  # never carried into JSON or a trace
        except Exception as exc:  # the parser raises ValueError, and others on odd input
            raise BadExposition(f"not Prometheus text ({_short(exc)})") from None

    def total(self, name: str | None) -> float | None:
        rows = self.by_name.get(name or "")
        return sum(v for _, v in rows) if rows else None

    def mean(self, name: str | None) -> float | None:
        rows = self.by_name.get(name or "")
        return sum(v for _, v in rows) / len(rows) if rows else None

    def by_label(self, name: str | None, label: str) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for labels, value in self.by_name.get(name or "", []):
            if label in labels:
                out[labels[label]] += value
        return dict(out)

    def labels(self, name: str | None) -> dict[str, str]:
        rows = self.by_name.get(name or "")
        return rows[0][0] if rows else {}

    def histogram(self, base: str | None) -> Histogram | None:
        buckets = self.by_label(f"{base}_bucket", "le") if base else {}
        if not buckets:
            return None
        bounds = sorted(buckets, key=float)
        return Histogram(tuple(float(b) for b in bounds), tuple(buckets[b] for b in bounds),
                         self.total(f"{base}_sum") or 0.0, self.total(f"{base}_count") or 0.0)


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 80 else text[:77] + "..."


def _int(value: str | None) -> int | None:
    try:
        number = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return int(number) if math.isfinite(number) and number > 0 else None


def parse_exposition(text: str, t: float) -> ReplicaSample:
    """The replica's numbers from its /metrics text; BadExposition says why it is not one."""
    samples = _Samples(text)
    flavour = detect_flavour(set(samples.by_name))
    if flavour is None:
        raise BadExposition("no vLLM, SGLang or batchtop metrics in it" if samples.by_name
                            else "an empty exposition")
    names: MetricNames = NAMES[flavour]
    counters = {key: value for key in COUNTERS
                if (value := samples.total(getattr(names, key))) is not None}
    hists: dict[str, Histogram] = {}
    for key in HISTOGRAMS:
        wanted = getattr(names, key)
        for base in (wanted if isinstance(wanted, tuple) else (wanted,)):
            h = samples.histogram(base)
            if h is not None:
                hists[key] = h
                break
    info = samples.labels(names.cache_info)
    model = samples.labels(names.running).get("model_name")
    modes = {m: v for m, v in samples.by_label(BATCHTOP_MODE, "mode").items() if v > 0}
    max_seqs = samples.total(BATCHTOP_MAX_NUM_SEQS)
    return ReplicaSample(
        t=t, flavour=flavour, model_name=model,
        running=samples.total(names.running), waiting=samples.total(names.waiting),
        waiting_by_reason=samples.by_label(names.waiting_by_reason, "reason"),
        kv_usage=samples.mean(names.kv_usage), counters=counters,
        success=samples.by_label(names.success, "finished_reason"), histograms=hists,
        num_gpu_blocks=_int(info.get("num_gpu_blocks")), block_size=_int(info.get("block_size")),
        kv_capacity_tokens=samples.total(names.kv_capacity_tokens),
        max_num_seqs=int(max_seqs) if max_seqs else None, mode=next(iter(modes), None))
