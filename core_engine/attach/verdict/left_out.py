"""Scrapes the verdict did not read because their numbers were implausible (plausible.py): the verdict
says so while such a scrape lies inside the span it reads, and its evidence keeps the count."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from batchtop.core_engine.attach.scrape.plausible import IMPLAUSIBLE
from batchtop.core_engine.attach.scrape.scrape import BAD
from batchtop.core_engine.attach.verdict.verdict import Verdict
from batchtop.core_engine.attach.verdict.verdict_span import SPAN_POINTS, SPAN_S


@dataclass(frozen=True, slots=True)
class LeftOutScrape:
    tick: int
    t: float
    url: str
    reason: str


class LeftOut:
    def __init__(self) -> None:
        self.total = 0
        self.newest: LeftOutScrape | None = None
        self._recent: list[LeftOutScrape] = []

    def saw(self, tick: int, t: float, url: str, status: str, reason: str | None) -> None:
        if status == BAD and reason is not None and reason.startswith(IMPLAUSIBLE):
            self.newest = LeftOutScrape(tick, t, url, reason)
            self._recent.append(self.newest)
            self.total += 1

    def applied(self, verdict: Verdict | None, tick: int, t: float) -> Verdict | None:
        """The verdict with what it left out, while a left-out scrape is inside the span it reads."""
        self._recent = [s for s in self._recent if s.tick > tick - SPAN_POINTS or s.t >= t - SPAN_S]
        if verdict is None or self.newest is None:
            return verdict
        evidence = dict(verdict.evidence)
        evidence["implausible_scrapes"] = {"total": self.total, "recent": len(self._recent),
                                           "url": self.newest.url, "reason": self.newest.reason}
        if not self._recent:
            return dataclasses.replace(verdict, evidence=evidence)
        n = len(self._recent)
        line = (f"{verdict.line} [left out: {n} scrape{'s' if n > 1 else ''} of {self.newest.url}, "
                f"{self.newest.reason}]")
        return dataclasses.replace(verdict, line=line, evidence=evidence)
