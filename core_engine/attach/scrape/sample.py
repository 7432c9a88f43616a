"""One scrape of one replica: the Prometheus text parsed (by prometheus_client's own parser) into the
numbers attach shows, summed over the label sets a server splits them by (engines, ranks, models).

Each series attach reads must be believable before it is summed: the same series twice (same name,
same labels), a negative gauge or counter, a KV share above 1 or a sum too large for a float make the
exposition BAD (plausible.py checks the parsed sample again, for replays). So does an exposition that
mixes two servers' names, or lacks the running and waiting gauges its server always exposes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from batchtop.core_engine.attach.scrape.histogram import Histogram
from batchtop.core_engine.attach.servers import family
from batchtop.core_engine.attach.servers.detect import detect_flavour, nothing_known
from batchtop.core_engine.attach.servers.family import MetricNames, ServerFamily

COUNTERS = ("prompt_tokens", "generation_tokens", "preemptions", "flops", "read_bytes", "write_bytes",
            "prefix_queries", "prefix_hits")
HISTOGRAMS = ("ttft", "itl", "e2e", "queue_time", "iteration_tokens", "prompt_len", "generation_len")
MAX_SIZE = 1 << 31  # a slot ceiling or step budget past this is no real server's
KV_SLACK = 1e-6  # float noise above a full pool
START_TIME = "process_start_time_seconds"  # prometheus_client's process collector: a new value is a restart


class BadExposition(ValueError):
    """Not Prometheus text (nor TensorRT-LLM's JSON), or text no server attach knows would send."""


@dataclass(frozen=True, slots=True)
class Slot:
    """One of llama.cpp's slots, from its /slots endpoint."""

    id: int
    processing: bool
    n_ctx: int | None = None  # tokens of context this slot may hold
    n_decoded: int | None = None  # tokens its current request has generated

    def as_dict(self) -> dict:
        return {"id": self.id, "processing": self.processing, "n_ctx": self.n_ctx, "n_decoded": self.n_decoded}


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
    max_num_seqs: int | None = None  # the slot ceiling, where the server says it (ceiling_from: which metric)
    mode: str | None = None  # batchtop serve's batching policy
    start_time: float | None = None  # process_start_time_seconds, when the server exposes it
    ceiling_from: str | None = None
    token_budget: int | None = None  # the most tokens one step may hold, where the server says it
    slots: tuple[Slot, ...] | None = None  # llama.cpp's /slots
    note: str | None = None  # what this scrape could not read (llama.cpp's /slots off, no new iterations)

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__slots__ if k not in ("histograms", "slots")}
        out["histograms"] = {k: h.as_dict() for k, h in self.histograms.items()}
        out["slots"] = None if self.slots is None else [s.as_dict() for s in self.slots]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> ReplicaSample:
        """A recorded sample; fields added since it was recorded stay at their defaults."""
        fields = {k: data.get(k) for k in cls.__slots__ if k not in ("histograms", "slots")}
        for k in ("waiting_by_reason", "counters", "success"):
            fields[k] = dict(fields[k] or {})
        hists = {k: Histogram.from_dict(h) for k, h in (data.get("histograms") or {}).items()}
        slots = data.get("slots")
        return cls(**fields, histograms=hists, slots=None if slots is None else tuple(Slot(**s) for s in slots))


class _Samples:
    """Sample name -> [(labels, value)], from the parsed families."""

    def __init__(self, text: str) -> None:
        self.by_name: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        self.names: set[str] = set()  # every sample name, NaN-valued ones too
        try:
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    self.names.add(s.name)
                    value = float(s.value)
                    if math.isfinite(value):  # Prometheus text may say NaN or +Inf: shown as not exposed,
                        self.by_name[s.name].append((s.labels, value))  # never carried into JSON or a trace
        except Exception as exc:  # the parser raises ValueError, and others on odd input
            raise BadExposition(f"not Prometheus text ({_short(exc)})") from None

    def check(self, server: ServerFamily) -> None:
        """BadExposition for the first series attach reads that no real server exposes."""
        names = server.names
        for name in sorted(_read_names(names)):
            seen: set[tuple[tuple[str, str], ...]] = set()
            for labels, value in self.by_name.get(name, []):
                key = tuple(sorted(labels.items()))
                if key in seen:
                    raise BadExposition(f"duplicate series {_series(name, labels)}")
                seen.add(key)
                if value < 0:
                    raise BadExposition(f"negative {_series(name, labels)} = {value:g}")
                if name == names.kv_usage and value > 1 + KV_SLACK:
                    raise BadExposition(f"{_series(name, labels)} = {value:g}: KV usage outside 0..1")
                if name == names.ceiling and server.ceiling_limit is not None and value > server.ceiling_limit:
                    raise BadExposition(f"{name} = {value:g}: {server.label} runs at most {server.ceiling_limit}")
                if name in (names.ceiling, names.token_budget) and value > MAX_SIZE:
                    raise BadExposition(f"{_series(name, labels)} = {value:g}: no server runs that many")

    def _sum(self, name: str, values: list[float]) -> float:
        total = sum(values)
        if not math.isfinite(total):
            raise BadExposition(f"{name} adds up to more than a float holds")
        return total

    def total(self, name: str | None) -> float | None:
        rows = self.by_name.get(name or "")
        return self._sum(name or "", [v for _, v in rows]) if rows else None

    def mean(self, name: str | None) -> float | None:
        rows = self.by_name.get(name or "")
        return self._sum(name or "", [v for _, v in rows]) / len(rows) if rows else None

    def by_label(self, name: str | None, label: str) -> dict[str, float]:
        out: dict[str, list[float]] = defaultdict(list)
        for labels, value in self.by_name.get(name or "", []):
            if label in labels:
                out[labels[label]].append(value)
        return {k: self._sum(name or "", v) for k, v in out.items()}

    def labels(self, name: str | None) -> dict[str, str]:
        rows = self.by_name.get(name or "")
        return rows[0][0] if rows else {}

    def histogram(self, base: str | None) -> Histogram | None:
        buckets = self.by_label(f"{base}_bucket", "le") if base else {}
        if not buckets:
            return None
        try:
            bounds = sorted(buckets, key=float)
        except ValueError:
            bad = next(b for b in buckets if not _is_float(b))
            raise BadExposition(f"{base}_bucket has le={bad!r}, not a number") from None
        return Histogram(tuple(float(b) for b in bounds), tuple(buckets[b] for b in bounds),
                         self.total(f"{base}_sum") or 0.0, self.total(f"{base}_count") or 0.0)


def _read_names(names: MetricNames) -> set[str]:
    """Every sample name attach sums or reads for this flavour (histograms: their three series)."""
    out = set()
    for key in names.__slots__:
        value = getattr(names, key)
        for name in (value if isinstance(value, tuple) else (value,)):
            if not isinstance(name, str) or key in ("cache_info", "mode"):
                continue
            out.add(name)
            if key in HISTOGRAMS:
                out.update(f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
    return out


def _series(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    text = f"{name}{{{inner}}}" if inner else name
    return text if len(text) <= 100 else text[:97] + "..."


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 80 else text[:77] + "..."


def _int(value: str | None) -> int | None:
    try:
        number = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return int(number) if math.isfinite(number) and number > 0 else None


def _whole(value: float | None) -> int | None:
    return int(value) if value is not None and value >= 1 else None


def _finished(samples: _Samples, names: MetricNames) -> dict[str, float]:
    """Finished requests by reason; a counter without the finished_reason label counts as "success"."""
    out = samples.by_label(names.success, "finished_reason")
    if not out and (total := samples.total(names.success)) is not None:
        out = {"success": total}
    if (failed := samples.total(names.failures)) is not None:
        out["error"] = out.get("error", 0.0) + failed
    return out


def parse_exposition(text: str, t: float) -> ReplicaSample:
    """The replica's numbers from its /metrics text; BadExposition says why it is not one."""
    samples = _Samples(text)
    try:
        flavour = detect_flavour(samples.names)
    except ValueError as exc:
        raise BadExposition(str(exc)) from None
    if flavour is None:
        raise BadExposition(f"no {nothing_known()} metrics in it" if samples.names else "an empty exposition")
    server = family(flavour)
    names: MetricNames = server.names
    missing = [n for n in (names.running, names.waiting) if n not in samples.names]
    if missing:
        raise BadExposition(f"{server.label} metrics without {' or '.join(missing)}: {server.label} always "
                            "exposes its running and waiting gauges")
    samples.check(server)
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
    if names.tokens_from_requests:  # TGI: prompts counted as they arrive, outputs as requests finish
        for counter, hist in (("prompt_tokens", "prompt_len"), ("generation_tokens", "generation_len")):
            if hist in hists:
                counters[counter] = hists[hist].sum
    if (steps := samples.total(names.steps)) is not None:
        counters["steps"] = steps
    info = samples.labels(names.cache_info)
    model = samples.labels(names.running).get("model_name")
    modes = {m: v for m, v in samples.by_label(names.mode, "mode").items() if v > 0}
    ceiling = _whole(samples.total(names.ceiling))
    start = samples.by_name.get(START_TIME)
    return ReplicaSample(
        t=t, flavour=flavour, model_name=model,
        running=samples.total(names.running), waiting=samples.total(names.waiting),
        waiting_by_reason=samples.by_label(names.waiting_by_reason, "reason"),
        kv_usage=samples.mean(names.kv_usage), counters=counters,
        success=_finished(samples, names), histograms=hists,
        num_gpu_blocks=_int(info.get("num_gpu_blocks")), block_size=_int(info.get("block_size")),
        kv_capacity_tokens=samples.total(names.kv_capacity_tokens),
        max_num_seqs=ceiling, mode=next(iter(modes), None),
        start_time=start[0][1] if start else None, ceiling_from=names.ceiling if ceiling else None,
        token_budget=_whole(samples.total(names.token_budget)))
