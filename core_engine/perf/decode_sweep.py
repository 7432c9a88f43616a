"""A measured decode sweep: B same-length sequences decoding together on the real engine, for each B
and each length.

What `batchtop calibrate` fits its constants to, and what the decode benches time. The sweep takes one
step of each point in turn (DecodeProbes), and a bench can take those steps between another engine's,
to check a fit against steps measured in the same seconds.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.kv_cache import cdiv
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.worker.model_runner import ModelRunner
from batchtop.core_engine.model.cost import StepCost
from batchtop.core_engine.engine.snapshot import StepSnapshot

COST_FIELDS = StepCost.__slots__


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured step: its work (the roofline's FLOPs and bytes, GEMMs and attention apart) and how
    long it took."""

    batch: int
    cost: StepCost
    seconds: float
    context: int | None = None  # a sweep's prompt length (every row's); None for a recorded session's steps

    def as_dict(self) -> dict:
        return {"batch": self.batch, "context": self.context,
                **{name: getattr(self.cost, name) for name in COST_FIELDS}, "seconds": self.seconds}


def sweep_prompt(engine: Engine, context: int, row: int = 0) -> tuple[int, ...]:
    """Any ids the model has; each row's first token differs, so no two rows share a prefix-cache block
    (rows reading one shared copy of their KV would measure a cheaper decode than a real batch's)."""
    vocab = engine.config.model.vocab_size - 1
    return (1 + row % vocab,) + tuple(1 + i % vocab for i in range(1, context))


def decode_steps(engine: Engine, batch: int, context: int, steps: int) -> list[StepSnapshot]:
    """Snapshots of `steps` pure-decode steps at exactly `batch` rows, after one warm-up step
    (its allocator and cache misses would overstate the cost)."""
    return list(decode_step_stream(engine, batch, context, steps))


def decode_step_stream(engine: Engine, batch: int, context: int, steps: int) -> Iterator[StepSnapshot]:
    """decode_steps' snapshots one at a time, each as soon as its step ran: a bench can measure the
    device between them."""
    engine.load_workload([Request(f"b{batch}-{i}", sweep_prompt(engine, context, i), steps + 4) for i in range(batch)])
    seen = 0
    while not engine.is_done():
        snap = engine.step()
        if snap.is_step and snap.num_prefill_tokens == 0 and snap.num_seqs == batch:
            seen += 1
            if 1 < seen <= steps + 1:
                yield snap
    if seen <= steps:
        raise RuntimeError(f"{batch} sequences of {context} tokens decoded {seen} steps together, "
                           f"not {steps + 1}: refused, or their pool is too small")


def decode_sweep(engine: Engine, batches: list[int], contexts: list[int], steps: int,
                 rounds: int = 1) -> list[StepSample]:
    """`steps` x `rounds` measured decode steps at each batch size and context, one step of each in turn,
    each on an engine and KV pool of its own over `engine`'s weights (DecodeProbes); each point starts
    over from its own context after every `steps` (a round), so the contexts stay where they were asked.

    One step of each in turn, not each point's steps together: on a shared host whose speed drifts
    from one second to the next, every point then meets the same seconds of it, and the fit the same
    host at every batch size (measured a few seconds apart, batch 8's steps came out faster at 512
    tokens of context than at 128, and the attention efficiency fitted to them at 1.5 instead of 0.5).
    Every point is prefilled and decoded once, unmeasured, before the first measured step."""
    probes = DecodeProbes(engine, batches, contexts, steps)
    return [probes.step() for _ in range(steps * rounds * len(probes.points))]


class DecodeProbes:
    """Decode steps at fixed (batch size, context) points taken one at a time, in turn, between another
    engine's steps: on a host whose speed drifts from one second to the next, a calibration measured
    in the same seconds as the steps it is checked against sees the same host.

    Each point decodes on an engine of its own, with its own KV pool on the shared model's weights, so
    the engine they interleave with keeps its cache (and its tokens) untouched. `start` prefills every
    point (unmeasured) and takes one warm-up step; each `step` then decodes one point, the next in
    turn, and returns that step. A point's context grows by a token a step; after `steps` of them it
    starts over from its own context (that prefill unmeasured too), as `start` starts them all.
    """

    def __init__(self, engine: Engine, batches: list[int], contexts: list[int], steps: int) -> None:
        self.points = [(batch, context) for context in contexts for batch in batches]
        self.steps = steps
        model, self._clock = engine.runner.model, engine.clock
        self._pools = []  # (config, runner) per point
        for batch, context in self.points:
            per_seq = cdiv(context + steps + 4, engine.config.block_size)  # its sequences never outgrow the pool
            config = engine.config.with_(max_num_seqs=batch, max_num_batched_tokens=batch * context,
                                         num_kv_blocks=batch * per_seq)
            self._pools.append((config, ModelRunner(config, model=model)))
        self._engines: list[Engine] = []
        self._left: list[int] = []  # decode steps each point has before it starts over
        self._turn = 0

    def _fresh(self, i: int) -> Engine:
        (batch, context), (config, runner) = self.points[i], self._pools[i]
        probe = Engine(config, runner=runner, clock=self._clock)
        probe.load_workload([Request(f"p{batch}-{context}-{n}", sweep_prompt(probe, context, n), self.steps + 3)
                             for n in range(batch)])
        while True:  # the prefill, then one decode step at full batch to warm it up
            snap = probe.step()
            if snap.is_step and snap.num_prefill_tokens == 0 and snap.num_seqs == batch:
                return probe

    def start(self) -> None:
        self._engines = [self._fresh(i) for i in range(len(self.points))]
        self._left = [self.steps] * len(self.points)
        self._turn = 0

    def step(self) -> StepSample:
        if not self._engines:
            self.start()
        i, self._turn = self._turn, (self._turn + 1) % len(self.points)
        if not self._left[i]:
            self._engines[i], self._left[i] = self._fresh(i), self.steps
        self._left[i] -= 1
        snap = self._engines[i].step()
        batch, context = self.points[i]
        assert snap.is_step and snap.num_prefill_tokens == 0 and snap.num_seqs == batch  # max_tokens leaves room
        return StepSample(batch, snap.cost, snap.step_time_s, context)


def sweep_points(samples: list[StepSample]) -> list[tuple[int, int | None]]:
    """Each (batch size, context) among the samples, in order."""
    return sorted({(s.batch, s.context) for s in samples}, key=lambda point: (point[0], point[1] or 0))


BURST = 3.0  # a step this many times its point's median: a neighbour's burst on a shared host


def typical_seconds(seconds: list[float]) -> tuple[float, list[bool]]:
    """The mean step time, bursts (over BURST times the median) left out, and which steps were kept.

    A mean, not a median: what the what-if model predicts is sums of step times (throughput,
    latencies), and on a host that flips between two speeds from one second to the next the median
    of a few dozen steps lands on one speed or the other while the mean stays between them."""
    limit = BURST * statistics.median(seconds)
    kept = [t <= limit for t in seconds]
    return statistics.mean(t for t, k in zip(seconds, kept) if k), kept


def sweep_means(samples: list[StepSample]) -> list[StepSample]:
    """One sample per (batch size, context): its typical step (the mean, bursts left out) and the mean
    work of the steps kept (a sweep's steps differ only by their context, which every field grows with)."""
    out = []
    for batch, context in sweep_points(samples):
        mine = [s for s in samples if (s.batch, s.context) == (batch, context)]
        seconds, kept = typical_seconds([s.seconds for s in mine])
        costs = [s.cost for s, k in zip(mine, kept) if k]
        out.append(StepSample(batch, StepCost(*(statistics.mean(getattr(c, name) for c in costs)
                                                for name in COST_FIELDS)), seconds, context))
    return out
