"""The verdict over time: a new one takes over only when CONFIRM ticks in a row point to it, so one
noisy scrape (a queue that empties for a moment, a KV reading that spikes) never flips it. While the
scrapes point elsewhere the line keeps the numbers it last showed for its verdict (never the old
verdict's words over signals that no longer say it), with the candidate beside it. Until the first
verdict is confirmed, the line says it is watching, and what the scrapes point to so far."""

from __future__ import annotations

import dataclasses

from batchtop.core_engine.attach.history import HistoryPoint
from batchtop.core_engine.attach.verdict import HEADLINES, Verdict, classify, explain
from batchtop.core_engine.attach.verdict_span import (PATTERN_POINTS, PATTERN_S, SPAN_POINTS, SPAN_S, pattern,
                                                      recent, summarize)

CONFIRM = 3


class VerdictTracker:
    def __init__(self) -> None:
        self.kind: str | None = None
        self.since_t: float | None = None
        self._candidate: str | None = None
        self._streak = 0
        self._last: Verdict | None = None
        self._plateau: int | None = None  # the ceiling the plateau last showed (servers that do not say it)

    def update(self, history: tuple[HistoryPoint, ...]) -> Verdict:
        points = recent(history, SPAN_S, SPAN_POINTS)
        span = summarize(points, self._plateau)
        if span is not None and span.ceiling_source == "inferred":
            self._plateau = span.ceiling
        if span is None and self._last is not None:
            return self._last  # no fresh scrape (the server is not answering): the last answer holds
        arrivals = pattern(recent(history, PATTERN_S, PATTERN_POINTS))
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
        return self._last
