"""The steps a server logged, as the attach monitor keeps them: each line parsed once (counted when it
names a step in a wording this batchtop does not know), stamped with the watch's clock, priced on the
roofline, and kept for the timeline; a view per tick with the real step rate, the engine's busy share and
the iteration numbers it skipped; and, for the verdict, what the steps of a span held."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from batchtop.core_engine.attach.streams.iteration_log import LoggedStep, NotAStep, parse_step
from batchtop.core_engine.attach.streams.log_follower import LogCounts
from batchtop.core_engine.attach.streams.step_point import StepPricer
from batchtop.core_engine.perf.roofline_point import RooflinePoint

KEPT = 2048  # steps the timeline, the roofline trail and the verdict's span can reach back to
SHOWN = 512  # steps a frame carries
RATE_WINDOW_S = 5.0  # steps per second over the last few seconds


@dataclass(frozen=True, slots=True)
class TimedStep:
    t: float  # seconds on the watch's clock when the line was read
    step: LoggedStep
    point: RooflinePoint | None


@dataclass(frozen=True, slots=True)
class StepLogView:
    steps: tuple[TimedStep, ...]  # the newest SHOWN, oldest first
    total: int  # step lines parsed since the watch began
    unparsed: int  # lines with a step marker in a wording not known here
    missed: int  # vLLM iteration numbers skipped between parsed lines (lines lost before batchtop read them)
    steps_per_s: float | None  # over the last RATE_WINDOW_S (None before a second of log)
    busy_share: float | None  # the steps' own elapsed time over that wall time (vLLM only)
    source: str | None  # "vllm" or "sglang": whose lines these are
    counts: LogCounts | None = None  # the follower's: other lines, long lines, dropped, why it ended

    @property
    def newest(self) -> TimedStep | None:
        return self.steps[-1] if self.steps else None

    def as_dict(self) -> dict:
        c = self.counts
        return {"steps": self.total, "unparsed_lines": self.unparsed, "missed_iterations": self.missed,
                "steps_per_s": self.steps_per_s, "busy_share": self.busy_share, "source": self.source,
                "other_lines": c.other_lines if c else None, "long_lines": c.long_lines if c else None,
                "dropped_lines": c.dropped if c else None, "log_ended": c.ended if c else None}


@dataclass(frozen=True, slots=True)
class StepSpan:
    """What the logged steps of a span held: the verdict's step-level evidence."""

    steps: int
    mean_rows: float
    at_budget_share: float | None  # steps whose tokens reach the token budget (None: budget unknown)
    idle_slot_share: float | None  # steps with fewer rows than the slot ceiling (None: ceiling unknown)
    prefill_share: float  # steps that carried prefill tokens
    max_tokens: int
    at_max_share: float  # steps holding exactly max_tokens: a budget nobody said, seen as a plateau

    def as_dict(self) -> dict:
        return {"steps": self.steps, "mean_rows": self.mean_rows, "at_budget_share": self.at_budget_share,
                "idle_slot_share": self.idle_slot_share, "prefill_share": self.prefill_share,
                "max_tokens": self.max_tokens, "at_max_share": self.at_max_share}


def _weighted(spans: list[StepSpan], share) -> float | None:
    known = [(s.steps, share(s)) for s in spans if share(s) is not None]
    return sum(n * v for n, v in known) / sum(n for n, _ in known) if known else None


def merge_spans(spans: list[StepSpan | None]) -> StepSpan | None:
    """The steps of several ticks as one span (each tick's shares weighted by its steps)."""
    spans = [s for s in spans if s is not None]
    if not spans:
        return None
    n = sum(s.steps for s in spans)
    top = max(s.max_tokens for s in spans)
    at_max = sum(s.steps * s.at_max_share for s in spans if s.max_tokens == top) / n
    return StepSpan(n, _weighted(spans, lambda s: s.mean_rows), _weighted(spans, lambda s: s.at_budget_share),
                    _weighted(spans, lambda s: s.idle_slot_share), _weighted(spans, lambda s: s.prefill_share),
                    top, at_max)


class StepLog:
    def __init__(self, pricer: StepPricer | None = None) -> None:
        self.pricer = pricer
        self.pool_tokens: int | None = None  # the server's KV pool in tokens, once /metrics says it
        self._steps: deque[TimedStep] = deque(maxlen=KEPT)
        self.total = self.unparsed = self.missed = 0
        self._last_iteration: dict[int, int] = {}

    def add(self, t: float, line: str) -> None:
        try:
            step = parse_step(line)
        except NotAStep:
            self.unparsed += 1
            return
        if step is None:
            return
        if step.iteration is not None:
            last = self._last_iteration.get(step.engine)
            if last is not None and step.iteration > last + 1:
                self.missed += step.iteration - last - 1
            self._last_iteration[step.engine] = step.iteration  # a restart (lower number) starts over
        point = self.pricer.point(step, self.pool_tokens) if self.pricer is not None else None
        self._steps.append(TimedStep(t, step, point))
        self.total += 1

    def view(self, t: float, counts: LogCounts | None = None) -> StepLogView:
        steps = tuple(self._steps)[-SHOWN:]
        recent = [s for s in self._steps if s.t > t - RATE_WINDOW_S]
        span = min(RATE_WINDOW_S, t - self._steps[0].t) if self._steps else 0.0
        rate = len(recent) / span if span >= 1.0 else None
        timed = [s.step.elapsed_s for s in recent if s.step.elapsed_s is not None]
        busy = min(1.0, sum(timed) / span) if timed and span >= 1.0 else None
        source = steps[-1].step.source if steps else None
        return StepLogView(steps, self.total, self.unparsed, self.missed, rate, busy, source, counts)

    def span(self, from_t: float, to_t: float, *, budget: int | None, ceiling: int | None) -> StepSpan | None:
        steps = [s.step for s in self._steps if from_t < s.t <= to_t and not s.step.sampled]
        if not steps:
            return None
        n = len(steps)
        at_budget = sum(s.tokens >= budget for s in steps) / n if budget else None
        idle = sum(s.rows < ceiling for s in steps) / n if ceiling else None
        top = max(s.tokens for s in steps)
        return StepSpan(n, sum(s.rows for s in steps) / n, at_budget, idle,
                        sum(s.prefill_tokens > 0 for s in steps) / n, top, sum(s.tokens == top for s in steps) / n)
