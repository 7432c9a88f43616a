"""Data-parallel replicas as one server: gauges and rates summed, histograms merged bucket by bucket
(percentiles are never averaged), the roofline point of the summed FLOP and byte rates, and the
imbalance line that names the replica furthest from the others.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchtop.core_engine.attach.scrape.histogram import merge_all
from batchtop.core_engine.perf.roofline_point import RooflinePoint
from batchtop.core_engine.attach.scrape.scrape import LIVE
from batchtop.core_engine.attach.stats import ReplicaStats, latency_table
from batchtop.core_engine.attach.scrape.delta import Delta

# metric -> (how to read it off a replica, the smallest difference from the mean worth a line, format)
IMBALANCE_METRICS = {
    "running": (lambda s: s.running, 2.0, "{:.0f}"),
    "waiting": (lambda s: s.waiting, 2.0, "{:.0f}"),
    "KV": (lambda s: None if s.kv_usage is None else 100 * s.kv_usage, 10.0, "{:.0f}%"),
    "TTFT p95": (lambda s: s.latency.get("ttft", {}).get("p95"), 0.05, "{:.2f} s"),
}
IMBALANCE_RATIO = 0.5  # a replica 50% above or below the mean of all


@dataclass(frozen=True, slots=True)
class Imbalance:
    metric: str
    replica: int
    name: str
    value: float
    mean: float

    def line(self) -> str:
        fmt = IMBALANCE_METRICS[self.metric][2]
        return (f"imbalance: replica {self.replica} ({self.name}) {self.metric} {fmt.format(self.value)} "
                f"vs mean {fmt.format(self.mean)}")

    def as_dict(self) -> dict:
        return {"metric": self.metric, "replica": self.replica, "url": self.name, "value": self.value,
                "mean": self.mean}


def _sum(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def merge_deltas(deltas: list[Delta]) -> Delta | None:
    if not deltas:
        return None
    keys = set().union(*(d.totals for d in deltas))
    hist_keys = set().union(*(d.histograms for d in deltas))
    hists = {}
    for k in hist_keys:
        merged = merge_all([d.histograms[k] for d in deltas if k in d.histograms])
        if merged is not None:
            hists[k] = merged
    success_keys = set().union(*(d.success for d in deltas))
    return Delta(max(d.dt for d in deltas), {k: sum(d.totals.get(k, 0.0) for d in deltas) for k in keys},
                 {k: sum(d.per_s.get(k, 0.0) for d in deltas) for k in keys}, hists,
                 {k: sum(d.success.get(k, 0.0) for d in deltas) for k in success_keys})


def combine_points(points: list[RooflinePoint]) -> RooflinePoint | None:
    """Summed FLOP/s over summed bytes/s: the fleet's intensity, weighted by what each replica moved."""
    if not points:
        return None
    flops = sum(p.flops_per_s for p in points)
    nbytes = sum(p.flops_per_s / p.intensity for p in points if p.intensity > 0)
    source = "measured" if all(p.source == "measured" for p in points) else "estimated"
    return RooflinePoint(flops / nbytes if nbytes > 0 else 0.0, flops, source)


def aggregate(replicas: list[ReplicaStats], windows: list[Delta | None], intervals: list[Delta | None]) -> ReplicaStats:
    """The fleet's numbers from the replicas that have any (a DOWN one keeps its last, and says so)."""
    known = [s for s in replicas if s.flavour is not None]
    live = sum(s.status == LIVE for s in replicas)
    reason = None if live == len(replicas) else f"{live} of {len(replicas)} replicas live"
    if not known:
        return ReplicaStats("aggregate", LIVE if live else replicas[0].status, reason)
    interval = merge_deltas([d for d in intervals if d is not None])
    window = merge_deltas([d for d in windows if d is not None])
    blocks = [s.num_gpu_blocks for s in known]
    kv = None
    if all(b for b in blocks) and all(s.kv_usage is not None for s in known):
        kv = sum(s.kv_usage * b for s, b in zip(known, blocks)) / sum(blocks)
    elif any(s.kv_usage is not None for s in known):
        kv = sum(s.kv_usage for s in known if s.kv_usage is not None) / sum(s.kv_usage is not None for s in known)
    seqs = [s.max_num_seqs for s in known]
    by_reason: dict[str, float] = {}
    for s in known:
        for k, v in s.waiting_by_reason.items():
            by_reason[k] = by_reason.get(k, 0.0) + v
    steps = interval.histograms.get("iteration_tokens") if interval is not None else None
    rates = {k: sum(s.rates.get(k, 0.0) for s in known) for k in sorted(set().union(*(s.rates for s in known)))}
    point = combine_points([s.point for s in known if s.point is not None])
    flavours = {s.flavour for s in known}
    return ReplicaStats(
        "aggregate", LIVE if live else known[0].status, reason, flavours.pop() if len(flavours) == 1 else "mixed",
        known[0].model_name, _sum([s.running for s in known]), _sum([s.waiting for s in known]), by_reason, kv,
        sum(seqs) if all(seqs) else None, known[0].max_num_seqs_source if all(seqs) else "unknown",
        sum(blocks) if all(blocks) else None, None, rates,
        {k: sum(s.window_rates.get(k, 0.0) for s in known) for k in sorted(set().union(*(s.window_rates for s in known)))},
        steps.mean if steps is not None else None,
        latency_table(window), window.dt if window is not None else None,
        dict(window.success) if window is not None else {}, point,
        None if point is not None else next((s.point_note for s in known if s.point_note), None),
        sum(s.resets for s in replicas), known[0].ceiling_from if all(seqs) else None,
        budgets.pop() if len(budgets := {s.token_budget for s in known}) == 1 else None)


def imbalances(replicas: list[ReplicaStats]) -> list[Imbalance]:
    """Per metric, the replica furthest from the mean, when it is far enough to matter."""
    out = []
    for metric, (read, min_diff, _) in IMBALANCE_METRICS.items():
        values = [(i, s, read(s)) for i, s in enumerate(replicas) if s.status == LIVE]
        values = [(i, s, v) for i, s, v in values if v is not None]
        if len(values) < 2:
            continue
        mean = sum(v for *_, v in values) / len(values)
        i, s, v = max(values, key=lambda row: abs(row[2] - mean))
        if abs(v - mean) >= min_diff and abs(v - mean) > IMBALANCE_RATIO * max(mean, 1e-12):
            out.append(Imbalance(metric, i, s.name, v, mean))
    return out


def worst(found: list[Imbalance]) -> Imbalance | None:
    """The one line the screen has room for: the largest relative deviation."""
    return max(found, key=lambda b: abs(b.value - b.mean) / max(b.mean, 1e-12), default=None)

