"""The verdict over time: a new one takes over only when CONFIRM ticks in a row point to it, so one
noisy scrape (a queue that empties for a moment, a KV reading that spikes) never flips it. While the
scrapes point elsewhere the line keeps the numbers it last showed for its verdict (never the old
verdict's words over signals that no longer say it), with the candidate beside it. Until the first
verdict is confirmed, the line says it is watching, and what the scrapes point to so far."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from batchtop.core_engine.attach.verdict.bursts import BurstWatch
from batchtop.core_engine.attach.history import HistoryPoint
from batchtop.core_engine.attach.verdict.verdict import HEADLINES, Verdict, classify, explain
from batchtop.core_engine.attach.verdict.verdict_span import (PATTERN_POINTS, PATTERN_S, SPAN_POINTS, SPAN_S, pattern,
                                                      recent, summarize)

CONFIRM = 3
MAX_STRETCHES = 200  # the newest kept: a flapping server over a day would otherwise grow it without end


@dataclass(frozen=True, slots=True)
class VerdictStretch:
    """One verdict held from one tick to another, with the words it last showed: a watch that ends as
    the load drains still says what bound the batch while the load ran."""

    kind: str
    from_t: float
    to_t: float
    line: str
    advice: str | None

    @property
    def seconds(self) -> float:
        return self.to_t - self.from_t

    def as_dict(self) -> dict:
        return {"bound": self.kind, "from_s": self.from_t, "to_s": self.to_t, "seconds": self.seconds,
                "line": self.line, "try": self.advice}


class VerdictTracker:
    def __init__(self) -> None:
        self.kind: str | None = None
        self.since_t: float | None = None
        self._candidate: str | None = None
        self._streak = 0
        self._last: Verdict | None = None
        self._plateau: int | None = None  # the ceiling the plateau last showed (servers that do not say it)
        self.bursts = BurstWatch()  # a client that sends batches, over the whole watch
        self.stretches: list[VerdictStretch] = []

    def update(self, history: tuple[HistoryPoint, ...]) -> Verdict:
        if history:
            self.bursts.see(history[-1])
        points = recent(history, SPAN_S, SPAN_POINTS)
        span = summarize(points, self._plateau)
        if span is not None and span.ceiling_source == "inferred":
            self._plateau = span.ceiling
        newest = history[-1] if history else None
        stale = newest is None or newest.dt is None or newest.running is None
        if (span is None or stale) and self._last is not None:
            # no fresh scrape this tick (DOWN, BAD, just restarted): the last answer holds, and the older
            # scrapes it rests on count once, not again on every tick until the server answers
            return self._last
        arrivals = pattern(recent(history, PATTERN_S, PATTERN_POINTS), self.bursts.reading())
        raw = classify(span, arrivals)
        t = points[-1].t if points else 0.0
        if raw == self.kind or raw == "watching":
            self._candidate, self._streak = None, 0
        else:
            self._streak = self._streak + 1 if raw == self._candidate else 1
            self._candidate = raw
            if self._streak >= CONFIRM:
                self.kind, self.since_t = raw, t
                self._candidate, self._streak = None, 0
        if raw != self.kind and self._last is not None and self._last.kind == self.kind:
            verdict = self._last  # the scrapes now point elsewhere: the line keeps what it last showed
        else:
            verdict = explain(self.kind or "watching", span, arrivals)
        if self.kind is None and self._candidate is not None:
            verdict = dataclasses.replace(verdict, line=f"watching: the scrapes point to {HEADLINES[self._candidate]} "
                                                        f"({self._streak} of the {CONFIRM} in a row it takes)")
        self._last = dataclasses.replace(verdict, since_s=None if self.since_t is None else t - self.since_t,
                                         candidate=self._candidate)
        if points:
            self._extend(self._last, t)
        return self._last

    def _extend(self, verdict: Verdict, t: float) -> None:
        last = self.stretches[-1] if self.stretches else None
        if last is not None and last.kind == verdict.kind:
            self.stretches[-1] = dataclasses.replace(last, to_t=t, line=verdict.line, advice=verdict.advice)
            return
        start = t if self.since_t is None or verdict.kind == "watching" else self.since_t
        if last is not None and start < last.to_t:
            start = last.to_t
        self.stretches.append(VerdictStretch(verdict.kind, start, t, verdict.line, verdict.advice))
        del self.stretches[:-MAX_STRETCHES]

    def over_watch(self, history: tuple[HistoryPoint, ...]) -> Verdict | None:
        """At the end of a watch, client (batches) where its bursts show the client's batches though no
        tick did (a short watch: two batches, then the server drained and sat idle); None otherwise, the
        verdicts held saying it already. Read over the points in which something was in flight."""
        barrier = self.bursts.reading(watch_ended=True)
        if barrier is None or self.bursts.reading() is not None:
            return None
        loaded = [p for p in history if p.dt is not None and (p.running or 0) + (p.waiting or 0) > 0]
        span = summarize(loaded)
        if span is None:
            return None
        return explain("client", span, pattern(loaded, barrier))

    def longest(self) -> VerdictStretch | None:
        """The verdict that held longest over the watch while there was a load (idle only when nothing
        else held: a watch started long before its load is still about the load)."""
        held = [s for s in self.stretches if s.kind != "watching"]
        loaded = [s for s in held if s.kind != "idle"] or held
        return max(loaded, key=lambda s: s.seconds) if loaded else None
