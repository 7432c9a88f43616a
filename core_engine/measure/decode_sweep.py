"""A measured decode sweep: B same-length sequences decoding together on the real engine, for each B
and each length.

What `batchtop calibrate` fits its constants to, and what the decode benches time.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.engine.request import Request
from batchtop.core_engine.engine.snapshot import StepCost, StepSnapshot

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


def decode_steps(engine: Engine, batch: int, context: int, steps: int) -> list[StepSnapshot]:
    """Snapshots of `steps` pure-decode steps at exactly `batch` rows, after one warm-up step
    (its allocator and cache misses would overstate the cost)."""
    prompt = tuple(1 + i % (engine.config.model.vocab_size - 1) for i in range(context))  # any ids the model has
    engine.load_workload([Request(f"b{batch}-{i}", prompt, steps + 4) for i in range(batch)])
    snaps = []
    while not engine.is_done():
        snap = engine.step()
        if snap.is_step and snap.num_prefill_tokens == 0 and snap.num_seqs == batch:
            snaps.append(snap)
    if len(snaps) <= steps:
        raise RuntimeError(f"{batch} sequences of {context} tokens decoded {len(snaps)} steps together, "
                           f"not {steps + 1}: refused, or their pool is too small")
    return snaps[1:steps + 1]


def decode_sweep(engine: Engine, batches: list[int], contexts: list[int], steps: int, rounds: int = 1, *,
                 warm_up: bool = True) -> list[StepSample]:
    """`steps` measured decode steps at each batch size and context per round, each on a fresh engine
    sharing `engine`'s model; the rounds interleave them, so a neighbour's burst on a shared host
    lands on one round of each, not on every step of one.

    Every batch size is first run once unmeasured, at the shortest context: the first steps after a
    model is built pay one-time costs (page faults in the pool, kernel set-up per batch shape) that
    made the first batch measured look ~15% slower than it runs, and a fit to it overpredicted every
    small batch. `warm_up=False` skips that, for a caller that measures more rounds later on an
    already warm model."""
    def probe(batch: int, context: int) -> Engine:
        return Engine(engine.config.with_(max_num_seqs=batch, max_num_batched_tokens=batch * context),
                      runner=engine.runner, clock=engine.clock)

    for batch in batches if warm_up else ():
        decode_steps(probe(batch, min(contexts)), batch, min(contexts), 2)
    samples = []
    for _ in range(rounds):
        for context in contexts:
            for batch in batches:
                samples += [StepSample(batch, s.cost, s.step_time_s, context)
                            for s in decode_steps(probe(batch, context), batch, context, steps)]
    return samples


def sweep_points(samples: list[StepSample]) -> list[tuple[int, int | None]]:
    """Each (batch size, context) among the samples, in order."""
    return sorted({(s.batch, s.context) for s in samples}, key=lambda point: (point[0], point[1] or 0))


def sweep_medians(samples: list[StepSample]) -> list[StepSample]:
    """One sample per (batch size, context), its median step: a neighbour's burst on a shared host
    skews a mean, not a median."""
    out = []
    for batch, context in sweep_points(samples):
        mine = [s for s in samples if (s.batch, s.context) == (batch, context)]
        out.append(StepSample(batch, median_cost([s.cost for s in mine]), statistics.median(s.seconds for s in mine),
                              context))
    return out


def median_cost(costs: list[StepCost]) -> StepCost:
    """Each field's median: a decode sweep's steps differ only by their context, which every field grows
    with, so together these are the middle step's figures."""
    return StepCost(*(statistics.median(getattr(c, name) for c in costs) for name in COST_FIELDS))
