"""The batchtop.attach/1 JSON: per replica and for the aggregate, the numbers the panels show."""

from __future__ import annotations

import statistics

from batchtop.core_engine.attach.monitor import AttachFrame, Monitor
from batchtop.core_engine.attach.servers import MIXED
from batchtop.core_engine.attach.stats import ReplicaStats
from batchtop.core_engine.attach.streams.step_log import StepLogView
from batchtop.core_engine.attach.streams.stream_state import StreamViews
from batchtop.core_engine.perf.device_peaks import DevicePeaks

SCHEMA = "batchtop.attach/1"


def stats_doc(s: ReplicaStats, peaks: DevicePeaks | None) -> dict:
    return {
        "url": s.name, "status": s.status, "reason": s.reason, "flavour": s.flavour, "model_name": s.model_name,
        "running": s.running, "waiting": s.waiting, "waiting_by_reason": s.waiting_by_reason,
        "kv_usage": s.kv_usage, "num_gpu_blocks": s.num_gpu_blocks,
        "max_num_seqs": s.max_num_seqs, "max_num_seqs_source": s.max_num_seqs_source, "mode": s.mode,
        "rates_per_s": s.rates, "window_rates_per_s": s.window_rates, "tokens_per_step": s.tokens_per_step,
        "latency_s": s.latency, "window_s": s.window_s, "finished": s.finished, "success_rate": s.success_rate,
        "roofline": None if s.point is None else s.point.as_dict(peaks), "roofline_note": s.point_note,
        "counter_resets": s.resets, "ceiling_from": s.ceiling_from, "token_budget": s.token_budget,
        "slots": None if s.slots is None else [slot.as_dict() for slot in s.slots], "note": s.note,
        "cannot_fill": cannot_fill(s),
    }


def cannot_fill(s: ReplicaStats) -> dict[str, str] | None:
    """What this server's metrics leave empty, in the panels' words (the monitor's reading); None with
    no answer yet, or for replicas of different servers ("mixed")."""
    if s.flavour is None or s.flavour == MIXED:
        return None
    return dict(s.cannot_fill)


def attach_report(monitor: Monitor, frame: AttachFrame, *, interval_s: float, peaks: DevicePeaks | None,
                  peaks_note: str, complete: bool, replayed_from: str | None = None) -> dict:
    replicas = []
    for stats, window in zip(frame.replicas, monitor.windows):
        doc = stats_doc(stats, peaks)
        doc["health"] = dict(window.status_counts)
        replicas.append(doc)
    doc = {
        "schema": SCHEMA, "complete": complete, "urls": monitor.urls, "interval_s": interval_s,
        "window_s": monitor.windows[0].window_s if monitor.windows else None, "duration_s": frame.t,
        "ticks": frame.tick,
        "device": {"peaks": peaks.as_dict() if peaks is not None else None, "source": peaks_note},
        "replicas": replicas, "aggregate": stats_doc(frame.aggregate, peaks),
        "imbalance": [b.as_dict() | {"line": b.line()} for b in frame.imbalances],
        "verdict": frame.verdict.as_dict() if frame.verdict is not None else None,
        "verdict_history": [stretch.as_dict() for stretch in monitor.tracker.stretches],
        "watch_verdict": watch.as_dict() if (watch := monitor.tracker.over_watch(frame.history)) else None,
    }
    if frame.streams is not None:
        doc["streams"] = streams_doc(frame.streams, peaks)
    if replayed_from is not None:
        doc["replayed_from"] = replayed_from
    return doc


def step_roofline(v: StepLogView, peaks: DevicePeaks | None) -> dict | None:
    """The logged steps the frame holds on the roofline: their medians, and how many beat the roofs."""
    points = [s.point for s in v.steps if s.point is not None]
    if not points:
        return None
    doc = {"priced_steps": len(points), "median_intensity_flop_per_byte": statistics.median(p.intensity for p in points),
           "median_flops_per_s": statistics.median(p.flops_per_s for p in points), "newest": points[-1].as_dict(peaks)}
    if peaks is not None:
        doc["above_roof"] = sum(p.fraction_of_roof(peaks) > 1.0 for p in points)
    return doc


def streams_doc(v: StreamViews, peaks: DevicePeaks | None) -> dict:
    """The side streams at the end of the watch: the logged steps and the prefix cache from KV events."""
    doc: dict = {}
    if v.steps is not None:
        doc["step_log"] = v.steps.as_dict() | {"roofline": step_roofline(v.steps, peaks)}
    if v.prefix is not None:
        p = v.prefix
        doc["prefix_cache"] = {
            "cached_blocks": p.cached_blocks, "block_size": p.block_size, "stored_blocks": p.stored_total,
            "removed_blocks": p.removed_total, "stored_per_s": p.stored_per_s, "removed_per_s": p.removed_per_s,
            "malformed_messages": p.malformed, "unknown_events": p.unknown_events, "left_out_events": p.left_out,
            "restarts": p.restarts, "partial": p.partial, "shared": p.shared,
            "top_prefixes": [{"tokens": x.tokens, "blocks": x.blocks, "continuations": x.continuations,
                              "text": x.text, "token_ids": list(x.token_ids), "starts_mid_prefix": x.starts_mid_prefix}
                             for x in p.top]}
    if v.kv_link is not None:
        doc["kv_link"] = v.kv_link
    return doc
