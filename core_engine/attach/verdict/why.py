"""Why the queue of a live server waits, in the Waiting panel's words: what the verdict says bounds
the batch, seen from the queue; until the verdict settles, what the newest scrape alone says (the
slots are full, the KV pool is full, the server preempts or defers) - or, when nothing explains it,
that arrivals simply outpace completions."""

from __future__ import annotations

from batchtop.core_engine.attach.history import HistoryPoint
from batchtop.core_engine.attach.stats import ReplicaStats
from batchtop.core_engine.attach.verdict.verdict import KV_FULL, Verdict

QUEUE_WAITS_FOR = {
    "slots": "the queue waits for a free slot (the verdict: slots)",
    "kv": "the queue waits for KV blocks (the verdict: KV cache)",
    "budget": "the queue waits for room in a step's token budget (the verdict: token budget)",
    "deferred": "the queue is deferred by the scheduler, not short of room (the verdict: deferred)",
    "client": "a few wait for the next step; the load, not the server, sets the batch (the verdict: client)",
}


def queue_trend(history: tuple[HistoryPoint, ...], span: int = 5) -> float | None:
    """Requests per second the queue grew (or shrank) over the last few scrapes."""
    points = [h for h in history if h.waiting is not None][-span:]
    if len(points) < 2 or points[-1].t <= points[0].t:
        return None
    return (points[-1].waiting - points[0].waiting) / (points[-1].t - points[0].t)


def why_waiting(s: ReplicaStats, verdict: Verdict | None = None, history: tuple[HistoryPoint, ...] = ()) -> str:
    if s.waiting is None:
        return "the server exposes no queue length"
    if s.waiting <= 0:
        return "nothing waits: every request is running"
    if verdict is not None and verdict.kind in QUEUE_WAITS_FOR:
        return QUEUE_WAITS_FOR[verdict.kind]
    return instant_reason(s, history)


def instant_reason(s: ReplicaStats, history: tuple[HistoryPoint, ...] = ()) -> str:
    """The newest scrape's reading alone, before the verdict has enough of them."""
    waiting, running = s.waiting or 0.0, s.running or 0.0
    if s.max_num_seqs and running >= s.max_num_seqs:
        return (f"slots full: {running:.0f} running = max_num_seqs {s.max_num_seqs}; the queue waits for a "
                "slot (more slots or replicas would admit it)")
    if s.kv_usage is not None and s.kv_usage >= KV_FULL:
        return f"KV cache full ({100 * s.kv_usage:.0f}%): the pool, not the slots, bounds the batch"
    if s.rates.get("preemptions", 0.0) > 0:
        return f"preempting {s.rates['preemptions']:.1f}/s: KV pressure sends running requests back to the queue"
    deferred = s.waiting_by_reason.get("deferred", 0.0)
    if deferred > 0 and deferred >= s.waiting_by_reason.get("capacity", 0.0):
        return f"{deferred:.0f} deferred by the scheduler (vLLM's 'deferred': not schedulable yet)"
    if s.max_num_seqs is None:
        capacity = s.waiting_by_reason.get("capacity")
        said = f"; vLLM says {capacity:.0f} wait for capacity" if capacity else ""
        return f"{running:.0f} running, KV {100 * (s.kv_usage or 0):.0f}%: slots likely full (ceiling unknown){said}"
    trend = queue_trend(history)
    if trend is not None and trend > 0:
        return f"queue growing {trend:.1f}/s with free slots and KV: the step's token budget admits few per step"
    return f"{waiting:.0f} waiting for admission at the next step (token budget per step)"
