"""Numbers no real server can expose, so attach never shows them as if they were true: a replica that
says them is BAD with the reason, and its last believable numbers stay on screen.

Checked twice, on different inputs: each series of the exposition text as it is parsed (a negative
series can hide inside a positive sum; sample.py), and each parsed sample as it enters a replica's
window (window.py), which is also where a replay meets samples recorded before these checks existed.
A counter that goes backwards is a restart only when the process could have restarted: a server that
exposes `process_start_time_seconds` and keeps it while a counter drops is lying, not restarting.

Requests are counted one by one: a running or waiting count that is not a whole number, or above what
any server holds, is implausible. Such a sample is BAD too, with a reason that starts "implausible",
and the verdict says it left the scrape out (monitor.py).
"""

from __future__ import annotations

from batchtop.core_engine.attach.scrape.histogram import Histogram
from batchtop.core_engine.attach.scrape.sample import KV_SLACK, ReplicaSample

GAUGES = ("running", "waiting", "kv_usage", "kv_capacity_tokens")
GROUPS = ("waiting_by_reason", "counters", "success")
SIZES = ("num_gpu_blocks", "block_size", "max_num_seqs", "token_budget")
IMPLAUSIBLE = "implausible"
# far above any real server: vLLM's largest --max-num-seqs in use is a few thousand (a data-parallel
# exposition sums its engines); a queue of a billion requests would not fit in a host's memory
MOST_RUNNING, MOST_WAITING = 1 << 20, 1 << 30
WHOLE = 1e-6  # float noise around a whole number


def histogram_problem(h: Histogram) -> str | None:
    """A histogram of durations or token counts: ascending bounds, cumulative counts, nothing negative."""
    if len(h.bounds) != len(h.counts) or not h.bounds:
        return f"{len(h.bounds)} bounds for {len(h.counts)} counts"
    if any(b <= a for a, b in zip(h.bounds, h.bounds[1:])):
        return "bucket bounds not ascending"
    if h.counts[0] < 0 or h.count < 0 or h.sum < 0:
        return "negative observations"
    if any(b < a for a, b in zip(h.counts, h.counts[1:])):
        return "bucket counts not cumulative (one is below the bucket before it)"
    return None


def _count_problem(name: str, value: float, most: int) -> str | None:
    if abs(value - round(value)) > WHOLE:
        return f"{IMPLAUSIBLE} {name} {value:g}: requests are counted in whole numbers"
    if value > most:
        return f"{IMPLAUSIBLE} {name} {value:g}: no server holds more than {most} requests"
    return None


def count_problem(s: ReplicaSample) -> str | None:
    """Running and waiting counts no server can report (checked after the negatives)."""
    counts = [("running", s.running, MOST_RUNNING), ("waiting", s.waiting, MOST_WAITING)]
    counts += [(f"waiting ({reason})", v, MOST_WAITING) for reason, v in sorted(s.waiting_by_reason.items())]
    for name, value, most in counts:
        problem = None if value is None else _count_problem(name, value, most)
        if problem is not None:
            return problem
    return None


def sample_problem(s: ReplicaSample) -> str | None:
    """Why this sample cannot be a real server's, or None."""
    for name in GAUGES:
        value = getattr(s, name)
        if value is not None and value < 0:
            return f"negative {name} ({value:g})"
    if s.kv_usage is not None and s.kv_usage > 1 + KV_SLACK:
        return f"KV usage {s.kv_usage:g} outside 0..1"
    for group in GROUPS:
        for key, value in getattr(s, group).items():
            if value < 0:
                return f"negative {key} ({value:g})"
    for name in SIZES:
        value = getattr(s, name)
        if value is not None and value < 1:
            return f"{name} {value} (must be >= 1)"
    for key, h in s.histograms.items():
        problem = histogram_problem(h)
        if problem is not None:
            return f"{key} histogram: {problem}"
    return count_problem(s)


def first_backwards(before: ReplicaSample, after: ReplicaSample) -> str | None:
    """The first counter (or finished-requests count, or histogram count) lower than before, with both values."""
    for key, v in before.counters.items():
        if after.counters.get(key, v) < v:
            return f"{key} went backwards ({v:g} -> {after.counters[key]:g})"
    for key, v in before.success.items():
        if after.success.get(key, v) < v:
            return f"finished {key} went backwards ({v:g} -> {after.success[key]:g})"
    for key, h in before.histograms.items():
        if key in after.histograms and after.histograms[key].count < h.count:
            return f"{key} count went backwards ({h.count:g} -> {after.histograms[key].count:g})"
    return None


def same_process(before: ReplicaSample, after: ReplicaSample) -> bool:
    return before.start_time is not None and before.start_time == after.start_time


def restarted(before: ReplicaSample, after: ReplicaSample) -> bool:
    """A new process start time: a restart even when its counters have already passed the old ones."""
    return None not in (before.start_time, after.start_time) and before.start_time != after.start_time
