"""What the attach panels show beyond the raw numbers, worked out once per tick by the monitor so the
panels only lay it out: per replica, what its server leaves empty (in the panels' words) and the
prefix cache's hit rate; for the main server (the one replica, or the aggregate), why its queue waits
and how fast it grows, the slot ceiling and where it comes from, llama.cpp's slots, the one imbalance
line the screen has room for, and the server's name."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from batchtop.core_engine.attach.aggregate import Imbalance, worst
from batchtop.core_engine.attach.coverage import coverage
from batchtop.core_engine.attach.history import HistoryPoint
from batchtop.core_engine.attach.servers import family, label
from batchtop.core_engine.attach.stats import ReplicaStats
from batchtop.core_engine.attach.verdict.verdict import Verdict
from batchtop.core_engine.attach.verdict.why import queue_trend, why_waiting


def cannot_fill(s: ReplicaStats) -> dict[str, str]:
    """What this replica's server leaves empty; the ceiling counts as filled when the server said it
    (llama.cpp's /slots answers on most servers, not all), TTFT when its histogram came after all."""
    if family(s.flavour) is None:
        return {}  # no answer yet, or replicas of different servers ("mixed")
    return {what: why for what, why in coverage(s.flavour).items()
            if why and not (what == "ceiling" and s.ceiling_from) and not (what == "ttft" and "ttft" in s.latency)}


def prefix_cache(s: ReplicaStats) -> str:
    """Tokens found cached / tokens looked up, over the window (vLLM's own counters)."""
    queries, hits = s.window_rates.get("prefix_queries"), s.window_rates.get("prefix_hits")
    if queries is None or hits is None:
        return "not exposed"
    if queries <= 0:
        return f"no lookups over {s.window_s:.0f}s" if s.window_s else "no lookups yet"
    return f"hit {100 * hits / queries:.0f}% of {queries * (s.window_s or 0):,.0f} prompt tokens over {s.window_s:.0f}s"


def with_readings(s: ReplicaStats) -> ReplicaStats:
    return dataclasses.replace(s, cannot_fill=cannot_fill(s), prefix_cache=prefix_cache(s))


@dataclass(frozen=True, slots=True)
class MainReadings:
    server: str  # the main server's family, as the screen names it
    why_waiting: str
    queue_trend: float | None  # requests per second the queue grew over the last few scrapes
    ceiling: int | None  # the slot ceiling: the server's, --max-num-seqs, or the plateau the verdict inferred
    ceiling_source: str  # "from <metric>", "from --max-num-seqs", "inferred from the plateau" or "unknown"
    busy_slots: tuple[bool, ...]  # llama.cpp's /slots, busy or idle, one by one (empty without them)
    slots_line: str  # what /slots says: how many are busy, and the busiest one's tokens
    imbalance: Imbalance | None  # the replica furthest out of line, when one is


def ceiling(m: ReplicaStats, verdict: Verdict | None) -> tuple[int | None, str]:
    """The slot ceiling and where it comes from: the server's metric, --max-num-seqs, or the plateau."""
    if m.max_num_seqs:
        if m.max_num_seqs_source == "server":
            return m.max_num_seqs, f"from {m.ceiling_from or 'the server'}"
        return m.max_num_seqs, f"from {m.max_num_seqs_source}"
    ev = verdict.evidence if verdict is not None else {}
    if ev.get("ceiling_source") == "inferred" and isinstance(ev.get("ceiling"), int):
        return ev["ceiling"], "inferred from the plateau"
    return None, "unknown"


def _slots(m: ReplicaStats) -> tuple[tuple[bool, ...], str]:
    slots = m.slots or ()
    busy = [s for s in slots if s.processing]
    longest = max(busy, key=lambda s: s.n_decoded or 0, default=None)
    tail = f"; slot {longest.id} has decoded {longest.n_decoded}" if longest and longest.n_decoded else ""
    line = f"{len(busy)}/{len(slots)} slots busy (from /slots){tail}" if slots else ""
    return tuple(s.processing for s in slots), line


def main_readings(main: ReplicaStats, verdict: Verdict | None, history: tuple[HistoryPoint, ...],
                  imbalances: tuple[Imbalance, ...]) -> MainReadings:
    top, source = ceiling(main, verdict)
    busy, line = _slots(main)
    return MainReadings(label(main.flavour), why_waiting(main, verdict, history), queue_trend(history), top, source,
                        busy, line, worst(list(imbalances)))
