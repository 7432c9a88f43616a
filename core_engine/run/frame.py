"""What the dashboard draws at one moment: the newest snapshot plus the short histories panels need.

Built on the engine thread (or by replay) and handed to the UI by swapping one reference, so the UI
never reads anything the engine is still changing. The engine's counterpart of attach's Monitor: no UI
library here, every front end (the dashboard, a test) folds snapshots the same way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from batchtop.core_engine.perf.live_roofs import RoofsView
from batchtop.core_engine.perf.metrics import MetricsCollector, RateWindow, percentiles
from batchtop.core_engine.perf.roofline_point import RooflinePoint
from batchtop.core_engine.sched.request import Phase
from batchtop.core_engine.engine.snapshot import SlotState, StepSnapshot
from batchtop.core_engine.engine.detokenizer import RequestText, TextBook, TextDelta

TIMELINE_STEPS = 240  # steps the slot timeline keeps
SPARK_POINTS = 120  # samples the sparklines keep
TRAIL_POINTS = 24  # recent steps drawn on the roofline

NO_TEXTS: Mapping = MappingProxyType({})
SlotCell = tuple[int, Phase, SlotState, bool]  # request index, phase, state, prompt padded this step
SlotColumn = tuple[SlotCell, ...]  # one step of the timeline, a cell per slot


@dataclass(frozen=True, slots=True)
class Pending:
    """What the keys asked for, where it differs from what the frame shows (tui/sources/pending.py folds it)."""

    mode: str | None = None  # the mode from the next admission on
    max_num_seqs: int | None = None  # the value from the next step on
    paused: bool | None = None  # True: pausing after the step in flight; False: resuming
    in_flight: bool = False  # the step in flight has taken them (it applied them as it began)

    def __bool__(self) -> bool:
        return self.mode is not None or self.max_num_seqs is not None or self.paused is not None


NOTHING = Pending()


@dataclass(frozen=True, slots=True)
class LiveMetrics:
    tok_s_now: float = 0.0
    tok_s_history: tuple[float, ...] = ()
    batch_history: tuple[float, ...] = ()
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    tpot_p50: float | None = None
    tpot_p99: float | None = None
    slot_utilization: float = 0.0
    kv_utilization: float = 0.0
    preemptions: int = 0
    completed: int = 0
    rejected: int = 0
    total: int = 0


@dataclass(frozen=True, slots=True)
class DashboardFrame:
    snapshot: StepSnapshot | None
    metrics: LiveMetrics
    timeline: tuple[SlotColumn, ...] = ()  # the most recent steps, oldest first
    trail: tuple[RooflinePoint, ...] = ()
    state: str = "paused"  # running | paused | finished | idle (a server out of work) | error | replay
    error: str | None = None
    caption: str | None = None  # scripted demos explain each stage here
    last_decode: StepSnapshot | None = None  # the newest step with decode rows: the roofline's verdict
    texts: Mapping[int, RequestText] = field(default_factory=lambda: NO_TEXTS)  # by request index; empty without a tokenizer
    roofs: RoofsView | None = None  # a live run's roofs, measured again as it runs (None: the panels' own)
    pending: Pending = NOTHING  # what the keys asked for that the engine has not applied yet (live only)


@dataclass
class FrameBuilder:
    """Folds snapshots into frames; owned by whichever thread produces snapshots."""

    collector: MetricsCollector = field(default_factory=MetricsCollector)
    rate: RateWindow = field(default_factory=RateWindow)
    timeline: deque = field(default_factory=lambda: deque(maxlen=TIMELINE_STEPS))
    tok_s: deque = field(default_factory=lambda: deque(maxlen=SPARK_POINTS))
    batch: deque = field(default_factory=lambda: deque(maxlen=SPARK_POINTS))
    trail: deque = field(default_factory=lambda: deque(maxlen=TRAIL_POINTS))
    last: StepSnapshot | None = None
    last_decode: StepSnapshot | None = None
    texts: TextBook = field(default_factory=TextBook)
    _generated: int = 0

    def observe(self, snap: StepSnapshot, text: TextDelta | None = None) -> None:
        """text: what the step added to its requests' text (live: the session's decoder; replay: the
        recorded text event)."""
        self.last = snap
        self.collector.observe(snap)
        self.texts.add(text or TextDelta(), [f.index for f in snap.finished])
        if not snap.is_step:
            return
        generated = snap.counters.generated_tokens
        self.rate.add(snap.t, generated - self._generated)
        self._generated = generated
        self.timeline.append(tuple((s.index, s.phase, state, s.num_prompt_padding > 0)
                                   for s, state in zip(snap.slots, snap.slot_states())))
        self.batch.append(float(snap.num_seqs))
        if snap.decode_cost.bytes > 0:
            self.last_decode = snap
        if snap.forward_s > 0 and snap.cost.bytes > 0:  # device work over the forward's own time
            self.trail.append(RooflinePoint(snap.cost.intensity, snap.cost.flops / snap.forward_s, "step",
                                            decode=snap.num_prefill_tokens == 0, batch=snap.num_seqs))

    def sample_rate(self) -> None:
        """One sparkline sample; called at the publish rate so the sparkline scrolls in time."""
        self.tok_s.append(self.rate.rate())

    def frame(self, state: str, error: str | None = None, caption: str | None = None) -> DashboardFrame:
        c = self.collector
        counters = self.last.counters if self.last is not None else None
        ttft = percentiles([f.ttft_s for f in c.finished if f.ttft_s is not None], (50, 99))
        tpot = percentiles([f.tpot_s for f in c.finished if f.tpot_s is not None], (50, 99))
        kv = (c.used_block_sum / (c.steps * self.last.num_blocks)) if c.steps and self.last else 0.0
        metrics = LiveMetrics(
            tok_s_now=self.rate.rate(), tok_s_history=tuple(self.tok_s), batch_history=tuple(self.batch),
            ttft_p50=ttft["p50"], ttft_p99=ttft["p99"], tpot_p50=tpot["p50"], tpot_p99=tpot["p99"],
            slot_utilization=c.share(SlotState.WORKING),
            kv_utilization=kv, preemptions=counters.preemptions if counters else 0,
            completed=counters.completed if counters else 0, rejected=counters.rejected if counters else 0,
            total=counters.submitted + self.last.num_pending_arrivals if counters else 0)
        return DashboardFrame(self.last, metrics, tuple(self.timeline), tuple(self.trail), state, error, caption,
                              self.last_decode, self.texts.view())


def restarted(snap: StepSnapshot) -> bool:
    """The run started over with this snapshot (`r`, a script's reset, or one in a recording)."""
    return any(name == "reset" for name, _ in snap.controls)
