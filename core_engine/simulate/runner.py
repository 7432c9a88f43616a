"""A runner with the ModelRunner's interface that runs no model: each step advances a virtual clock
by its modelled time and hands every sequence that completes a step a synthetic token, never an EOS
one, so every request's length follows its max_tokens on every model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from batchtop.core_engine.config import EngineConfig, ModelConfig
from batchtop.core_engine.engine.engine import plan_chunks
from batchtop.core_engine.sched.request import Sequence
from batchtop.core_engine.sched import SchedulerOutput
from batchtop.core_engine.model.cost import StepCost
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.model.cost import step_cost
from batchtop.core_engine.simulate.calibration import Calibration
from batchtop.core_engine.simulate.clock import VirtualClock


def synthetic_token(model: ModelConfig) -> int:
    """The token every simulated step hands out: the lowest id that is not one of the model's EOS ids.
    No model runs, so no answer ends on its own: a real model's requests run to max_tokens, as a
    preset's do (token 0 is SmolLM2's EOS: handed out, it ended every request after one token)."""
    eos = set(model.eos_token_ids)
    return next((t for t in range(model.vocab_size) if t not in eos), 0)


StepTimer = Callable[[StepCost], tuple[float, float]]  # a step's work -> (host seconds, device seconds)


class RooflineTimer:
    """The what-if model: calibrated roofline time plus each decoder layer's latency for the device
    work, a fixed host cost per step."""

    def __init__(self, peaks: DevicePeaks, calibration: Calibration, layers: int = 0) -> None:
        self.peaks = peaks
        self.calibration = calibration
        self.layers = layers  # the simulated model's decoder layers

    def __call__(self, cost: StepCost) -> tuple[float, float]:
        cal = self.calibration
        return cal.step_overhead_s, cal.device_time(cost, self.peaks) + cal.layers_time(self.layers)


class NullSampler:
    """Nothing is sampled, so there is no per-request state to forget."""

    def forget(self, seq: Sequence) -> None:
        pass

    def reset(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class SimulatedStep:
    logits_rows: range  # as many as the real runner would send to the lm_head
    sampled: tuple[Sequence, ...]
    device_s: float


class SimulatedRunner:
    def __init__(self, config: EngineConfig, clock: VirtualClock, timer: StepTimer) -> None:
        self.config = config
        self.clock = clock
        self.timer = timer
        self.sampler = NullSampler()
        self.token = synthetic_token(config.model)

    def prepare(self, plan: SchedulerOutput) -> SimulatedStep:
        """The host part of the step: its modelled overhead passes here, as input building would."""
        # a decode row, or the chunk that completes a prompt, yields a token; plan order is decodes first
        sampled = tuple(seq for seq, n in plan.scheduled if seq.num_computed_tokens + n == seq.num_tokens)
        rows = len(sampled) + len(plan.padding)  # static batching's padding rows reach the lm_head too
        cost = step_cost(self.config.model, self.config.dtype, plan_chunks(plan), num_logit_rows=rows)
        host_s, device_s = self.timer(cost)
        self.clock.advance(host_s)
        return SimulatedStep(range(rows), sampled, device_s)

    def run(self, batch: SimulatedStep) -> list[tuple[Sequence, int]]:
        self.clock.advance(batch.device_s)
        return [(seq, self.token) for seq in batch.sampled]
