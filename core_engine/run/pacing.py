"""Pace a trace's arrivals to the engine's measured capacity, so the default run keeps most slots busy.

The bundled trace was recorded on a GPU cluster; played at its own pace on a small CPU it either
floods the engine or leaves most slots empty. Instead, a short closed-loop run measures the real
engine at the target concurrency — `target` x max_num_seqs requests in flight, drawn from the
workload itself, each replaced as it finishes, so its steps mix prefill chunks and decodes as the
real run will. By Little's law, the arrival rate that keeps that many requests in the system is the
rate at which that loop completes them:

    rate = (tokens generated per second in the loop) / (mean output tokens per request)

and the trace is played at that rate. Static batching gets about a third of that throughput here, so
pressing `s` visibly grows the queue. A what-if run paces the same way against its simulated device:
the loop then runs on the engine's virtual clock, so its steps are modelled, not timed.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request, SamplingParams
from batchtop.core_engine.workload.raw import MAX_ARRIVAL_S
from batchtop.core_engine.simulate.clock import VirtualClock

TARGET_SLOT_UTILIZATION = 0.8
PROBE_BUDGET_S = 6.0  # the most step time the probe may take (a slow device measures less)


@dataclass(frozen=True, slots=True)
class Pace:
    time_scale: float  # multiplies the trace's arrival times
    target: float  # share of slots meant to be busy
    concurrency: int  # requests kept in flight while measuring
    tokens_per_s: float  # generated at that concurrency, measured
    steps: int
    basis: str = "measured"  # or "simulated": the loop ran on a what-if engine's virtual clock

    @property
    def speed(self) -> float:
        """How much faster than recorded the trace plays."""
        return 1.0 / self.time_scale

    def describe(self) -> str:
        return (f"trace at {self.speed:.2g}x its recorded pace, for ~{100 * self.target:.0f}% busy slots "
                f"({self.tokens_per_s:.0f} tok/s {self.basis} with {self.concurrency} requests in flight, "
                f"{self.steps} steps)")


def measure_throughput(engine: Engine, requests: list[Request], concurrency: int,
                       budget_s: float = PROBE_BUDGET_S) -> tuple[float, int]:
    """(generated tokens per second of step time, steps measured) of a closed loop at `concurrency`
    in its steady state, on a scratch engine sharing the model; it leaves nothing behind in `engine`.

    Every probe request has the workload's mean prompt and output lengths, and the first wave's
    outputs are staggered (1/N, 2/N, ... of the mean), so slots free up evenly from the start, as
    they do in a long run, instead of all at once: a step then carries about `concurrency` decodes
    plus the prefill of the requests refilling freed slots, the mix the real run will see."""
    prompt_len = max(1, round(statistics.fmean(r.prompt_len for r in requests)))
    output_len = max(2, round(statistics.fmean(r.max_tokens for r in requests)))
    ids = [t for r in requests for t in r.prompt_token_ids][:prompt_len]
    prompt = tuple(ids * (prompt_len // len(ids) + 1))[:prompt_len]
    first_wave = [max(1, round(output_len * (i + 1) / concurrency)) for i in range(concurrency)]
    lengths = first_wave + [output_len] * (2 * concurrency)
    # one prompt for every probe request: with a prefix cache they would all but skip their prefill
    probe = Engine(engine.config.with_(mode="continuous", max_num_seqs=concurrency, enable_prefix_caching=False),
                   runner=engine.runner, clock=engine.clock)
    # the probe's lengths are its own: a real model's EOS must not end a probe request early
    probe.load_workload([Request(f"pace{i}", prompt, n, sampling=SamplingParams(ignore_eos=True))
                         for i, n in enumerate(lengths)])
    first_ids = {f"pace{i}" for i in range(concurrency)}
    started: set[str] = set()
    busy, generated, steps, before = 0.0, 0, 0, 0
    while not probe.is_done() and steps < output_len and busy < budget_s:
        snap = probe.step()
        tokens, before = snap.counters.generated_tokens - before, snap.counters.generated_tokens
        if len(started) < concurrency:  # the first wave's own prefill, all at once, is no steady state:
            started |= first_ids.intersection(rid for rid, _ in snap.new_tokens)  # wait for its last first token
            continue
        busy += snap.step_time_s
        generated += tokens
        steps += 1
    return (generated / busy if busy else 0.0), steps


def pace(engine: Engine, requests: list[Request], target: float = TARGET_SLOT_UTILIZATION) -> Pace | None:
    """The time scale that keeps `target` of the slots busy; None when arrival times say nothing."""
    arrivals = [r.arrival_s for r in requests]
    span = max(arrivals) - min(arrivals)
    if span <= 0 or len(requests) < 2:
        return None
    concurrency = max(1, min(len(requests), round(target * engine.config.max_num_seqs)))
    tokens_per_s, steps = measure_throughput(engine, requests, concurrency)
    if not 0 < tokens_per_s < math.inf:
        return None
    rate = tokens_per_s / statistics.fmean(r.max_tokens for r in requests)
    recorded_rate = (len(requests) - 1) / span
    time_scale = recorded_rate / rate
    if not 0 < time_scale < math.inf or not max(arrivals) * time_scale <= MAX_ARRIVAL_S:
        return None  # no pace this engine can keep: the trace plays at its recorded one
    basis = "simulated" if isinstance(engine.clock, VirtualClock) else "measured"
    return Pace(time_scale, target, concurrency, tokens_per_s, steps, basis)


def paced(requests: list[Request], time_scale: float) -> list[Request]:
    return [replace(r, arrival_s=r.arrival_s * time_scale) for r in requests]
