"""Pace a trace's arrivals to the engine's measured capacity, so the default run keeps most slots busy.

The bundled trace was recorded on a GPU cluster; played at its own pace on a small CPU it either
floods the engine or leaves most slots empty. Instead, a few real steps measure what one decode step
and one prompt token cost here, and Little's law gives the arrival rate that keeps
`target` of the slots busy under continuous batching:

    busy slots = rate x seconds a request holds a slot
    seconds held = mean output tokens x step time,  step time = t_decode / (1 - c x rate x mean prompt)
  => rate = target x slots / (mean output x t_decode + target x slots x c x mean prompt)

where t_decode is a decode step at the target batch and c the cost of one prompt token. Static
batching gets about a third of that throughput here, so pressing `s` visibly grows the queue.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.engine.request import Request

TARGET_SLOT_UTILIZATION = 0.8
DECODE_STEPS = 6  # measured decode steps (the first after the prefill is skipped: warm-up)


@dataclass(frozen=True, slots=True)
class Pace:
    time_scale: float  # multiplies the trace's arrival times
    target: float  # share of slots meant to be busy
    decode_step_s: float  # measured at `batch` sequences
    prompt_token_s: float  # measured cost of one prompt token
    batch: int

    @property
    def speed(self) -> float:
        """How much faster than recorded the trace plays."""
        return 1.0 / self.time_scale if self.time_scale else float("inf")

    def describe(self) -> str:
        return (f"trace at {self.speed:.2g}x its recorded pace, for ~{100 * self.target:.0f}% busy slots "
                f"(decode step {1e3 * self.decode_step_s:.0f} ms at {self.batch} sequences, "
                f"{1e3 * self.prompt_token_s:.2f} ms per prompt token, measured)")


def measure_step_costs(engine: Engine, requests: list[Request], batch: int) -> tuple[float, float]:
    """(decode step seconds at `batch` rows, seconds per prompt token), from real steps on a scratch
    engine that shares the model; it leaves nothing behind in `engine`."""
    probe = Engine(engine.config.with_(mode="continuous", max_num_seqs=batch), runner=engine.runner)
    sample = [Request(f"pace{i}", r.prompt_token_ids, DECODE_STEPS + 2) for i, r in enumerate(requests[:batch])]
    probe.load_workload(sample)
    prefill_time, prefill_tokens, decode_times = 0.0, 0, []
    while not probe.is_done():
        snap = probe.step()
        if snap.num_prefill_tokens:
            prefill_time += snap.step_time_s
            prefill_tokens += snap.num_prefill_tokens
        elif snap.is_step and snap.num_seqs == len(sample):
            decode_times.append(snap.step_time_s)
    decode = statistics.median(decode_times[1:] or decode_times)
    # a prefill step also carries the decode rows' fixed cost (the weights are read once either way)
    per_token = max(0.0, prefill_time - decode) / max(1, prefill_tokens)
    return decode, per_token


def pace(engine: Engine, requests: list[Request], target: float = TARGET_SLOT_UTILIZATION) -> Pace | None:
    """The time scale that keeps `target` of the slots busy; None when arrival times say nothing."""
    arrivals = [r.arrival_s for r in requests]
    span = max(arrivals) - min(arrivals)
    if span <= 0 or len(requests) < 2:
        return None
    slots = engine.config.max_num_seqs
    batch = max(1, min(len(requests), round(target * slots)))
    decode_s, token_s = measure_step_costs(engine, requests, batch)
    mean_out = statistics.fmean(r.max_tokens for r in requests)
    mean_prompt = statistics.fmean(r.prompt_len for r in requests)
    rate = target * slots / (mean_out * decode_s + target * slots * token_s * mean_prompt)
    recorded_rate = (len(requests) - 1) / span
    return Pace(recorded_rate / rate, target, decode_s, token_s, batch)


def paced(requests: list[Request], time_scale: float) -> list[Request]:
    return [replace(r, arrival_s=r.arrival_s * time_scale) for r in requests]
