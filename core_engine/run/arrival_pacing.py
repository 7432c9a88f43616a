"""Closed-loop pacing of the bundled workload, so the default run keeps most slots busy on any machine,
however its speed changes while it runs.

The bundled requests come with the arrival times of a GPU cluster's trace; played at their own pace a
small CPU is flooded or left idle. Instead the run opens with a first wave that fills every slot, and
then plays the trace's arrivals (their order and burstiness) on a clock that runs faster or slower so
that, by Little's law, `target` x max_num_seqs requests stay in the system:

    arrival rate = (completion rate over the last 10 s, or 4 per slot) x target/occupancy x trim

(target/occupancy bounded to 0.5-2) where the trim integrates how far the occupancy is from the target (up while short, down above it),
all measured from the run itself, every step: a busy neighbour that halves the engine's speed halves the
completion rate and the arrivals with it. Above the target the trace's clock stops (`gate`): early
on the short answers finish first and the rate reads high, and a trace's bursts come at once; neither
may build a queue. Nothing is probed before the run starts. The controller learns only under a policy
that admits mid-batch (continuous batching): under one that refills only between batches (static
batching) occupancy follows the batches, not the arrivals, so it holds the pace it had and static's
lower throughput shows as a growing queue, as the teaching text says it should. A recording keeps the
real arrival times; each step's pace travels in its snapshot (`arrival_speed`), and `describe()` says
how the run was paced.
"""

from __future__ import annotations

import math
from collections import deque

from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.core_engine.sched.policies import policy_class
from batchtop.core_engine.sched.request import Request

TARGET_SLOT_UTILIZATION = 0.8
WINDOW_S = 10.0  # completions over this long measure the completion rate...
MIN_COMPLETIONS = 6  # ...or over as long as it took for this many, whichever is longer...
WINDOW_COMPLETIONS_PER_SLOT = 4  # ...but no more than this many per slot (a fast engine follows a change soon)
OCCUPANCY_S = 2.0  # the occupancy the correction reads is its mean over this long
SMOOTHING_S = 3.0  # time constant of the arrival rate's changes
MAX_GAIN, MIN_GAIN = 2.0, 0.5  # the occupancy gain's and trim's bounds (the gate stops arrivals above target)
TRIM_S = 4.0  # how fast the trim moves: e-fold in this long at 100% short of the target
FLOOR = 0.5  # share of the slots below which requests that leave are replaced at once
MAX_GAP_S = 1.0  # a longer gap between two looks (a pause) moves the trace clock this far only


class ClosedLoopPacer:
    """A WorkloadFeed (engine.arrivals) that plays its requests at the rate the run completes them."""

    def __init__(self, target: float = TARGET_SLOT_UTILIZATION, first_wave: int = 16) -> None:
        self.target = target
        self.first_wave = first_wave  # requests that arrive at once when the run starts (max_num_seqs)
        self._loaded: list[Request] = []
        self._trace_rate = 0.0  # the recording's mean arrivals per second
        self._rate: float | None = None  # the arrivals per second now; None until measured
        self._trim = 1.0  # the occupancy correction on the completion rate
        self._completions: deque[tuple[float, int]] = deque()  # (run time, completed so far)
        self._occupancy: deque[tuple[float, int]] = deque()  # (run time, requests in the system)
        self._speed_time = self._speed_sum = 0.0
        self._speed_min = self._speed_max = None
        self.held = False  # static batching: the pace is held, not learned
        self.restart()

    # -- the workload ------------------------------------------------------------------------------
    def load(self, requests: tuple[Request, ...]) -> None:
        self._loaded = sorted((*self._loaded, *requests), key=lambda r: r.arrival_s)
        if len(self._loaded) > 1:
            span = self._loaded[-1].arrival_s - self._loaded[0].arrival_s
            self._trace_rate = (len(self._loaded) - 1) / span if span > 0 else 0.0
        self.restart()

    def restart(self) -> None:
        self._pending = deque(self._loaded)
        wave = self._loaded[:self.first_wave]
        self._trace_t = wave[-1].arrival_s if wave else 0.0  # the first wave is due at once...
        self._wave_left = len(wave)  # ...and comes whole, through the gate
        self._last_now: float | None = None
        self._in_system = 0
        self._max_num_seqs = self.first_wave
        self._completions.clear()
        self._occupancy.clear()

    def __len__(self) -> int:
        return len(self._pending)

    def remove(self, request_id: str) -> bool:
        kept = deque(r for r in self._pending if r.id != request_id)
        removed = len(kept) != len(self._pending)
        self._pending = kept
        return removed

    # -- arrivals ------------------------------------------------------------------------------------
    @property
    def speed(self) -> float:
        """How many times as fast as recorded the trace plays now (0 until the first completions)."""
        if not self._rate or not self._trace_rate:
            return 0.0
        return self._rate / self._trace_rate

    @property
    def gate(self) -> int:
        """Under continuous batching nothing arrives while this many requests are in the system: the
        trace's clock stops, so a completion rate measured high (early on, the short answers finish first)
        cannot flood the queue, and the queue stays bounded."""
        return max(1, round(self.target * self._max_num_seqs)) + 1

    @property
    def floor(self) -> int:
        """Under continuous batching, while fewer than this many requests are in the system each one that
        leaves is replaced at once: the rate's window lags a host that just got faster, the slots need not."""
        return max(1, round(FLOOR * self._max_num_seqs))

    def _gated(self) -> bool:
        return not self._wave_left and not self.held and self._in_system >= self.gate

    def pop_due(self, now: float) -> list[tuple[float, Request]]:
        gap = 0.0 if self._last_now is None else min(max(0.0, now - self._last_now), MAX_GAP_S)
        self._last_now = now
        speed = self.speed
        if self._gated():
            return []
        self._trace_t += gap * speed
        if self._pending and self._in_system == 0 and self._pending[0].arrival_s > self._trace_t \
                and self._completions:  # nothing to wait for: the next request comes now
            self._trace_t = self._pending[0].arrival_s
        # until a rate is measured (the first wave's worth of completions), each request that leaves is
        # replaced at once (the gate still holds): the slots stay as full as the first wave left them
        # and below the floor (the host just got faster, the rate still reads the slow past) likewise
        refill = (self._rate is None or self._in_system < self.floor) and bool(self._completions) and not self.held
        due = []
        while self._pending and (refill or self._pending[0].arrival_s <= self._trace_t) and not self._gated():
            self._trace_t = max(self._trace_t, self._pending[0].arrival_s)
            request = self._pending.popleft()
            self._wave_left = max(0, self._wave_left - 1)
            late = (self._trace_t - request.arrival_s) / speed if speed > 0 else 0.0
            due.append((max(now - gap, now - late), request))  # when it arrived, within this gap
            self._in_system += 1
        return due

    def next_arrival(self, now: float) -> float | None:
        if not self._pending:
            return None
        if self._in_system == 0 and self._completions:
            return now
        speed = self.speed
        if speed <= 0 or self._gated():
            return None  # nothing is scheduled until the first completions, or while the gate is shut
        return now + max(0.0, self._pending[0].arrival_s - self._trace_t) / speed

    # -- the controller --------------------------------------------------------------------------------
    def observe(self, snap: StepSnapshot) -> None:
        if not snap.is_step:
            return
        t = snap.t
        self._in_system = snap.num_running + snap.num_waiting
        self._max_num_seqs = snap.max_num_seqs
        self._completions.append((t, snap.counters.completed))
        self._occupancy.append((t, self._in_system))
        done = snap.counters.completed
        most = WINDOW_COMPLETIONS_PER_SLOT * snap.max_num_seqs
        while len(self._completions) > 2 and done - self._completions[1][1] >= MIN_COMPLETIONS \
                and (t - self._completions[1][0] >= WINDOW_S or done - self._completions[1][1] >= most):
            self._completions.popleft()
        while len(self._occupancy) > 1 and t - self._occupancy[0][0] > OCCUPANCY_S:
            self._occupancy.popleft()
        self.held = not policy_class(snap.mode).admits_mid_batch and self._rate is not None  # none yet: learn
        if not self.held:
            self._learn(snap, t)
        self._note_speed(snap.step_time_s)

    def _learn(self, snap: StepSnapshot, t: float) -> None:
        (t0, done0), (t1, done1) = self._completions[0], self._completions[-1]
        if done1 - done0 < 2 or t1 <= t0:
            return
        if self._rate is None and done1 < self.first_wave:  # still refilling: the slots turn over once
            return                                         # at full occupancy, a measure of capacity
        completion_rate = (done1 - done0) / (t1 - t0)
        occupancy = sum(n for _, n in self._occupancy) / len(self._occupancy)
        wanted = self.target * snap.max_num_seqs
        # integral action: the trim grows while occupancy is short of the target and shrinks above it,
        # so the pace settles at the target whatever the requests' lengths and the host's speed
        # in a closed loop the completion rate follows the arrivals: short of the target it reads the pace,
        # not the capacity. Scaled by target/occupancy (Little's law, bounded) it estimates the capacity...
        gain = min(MAX_GAIN, max(MIN_GAIN, wanted / max(occupancy, 0.5)))
        # ...and an integral trim removes what is left: it grows while occupancy is short of the target and
        # shrinks above it, so the pace settles at the target whatever the lengths and the host's speed
        error = (wanted - occupancy) / max(wanted, 1.0)
        self._trim = min(MAX_GAIN, max(MIN_GAIN, self._trim * math.exp(error * snap.step_time_s / TRIM_S)))
        rate = completion_rate * gain * self._trim
        if self._rate is None:
            self._rate = rate
        else:
            self._rate += (rate - self._rate) * min(1.0, snap.step_time_s / SMOOTHING_S)

    def _note_speed(self, seconds: float) -> None:
        speed = self.speed
        if speed <= 0:
            return
        self._speed_time += seconds
        self._speed_sum += speed * seconds
        self._speed_min = speed if self._speed_min is None else min(self._speed_min, speed)
        self._speed_max = speed if self._speed_max is None else max(self._speed_max, speed)

    # -- what it says ------------------------------------------------------------------------------------
    def describe(self) -> str:
        """How the run is (or was) paced, for the metrics JSON and the trace header."""
        wave = min(self.first_wave, len(self._loaded)) if self._loaded else self.first_wave
        text = (f"closed loop: a first wave of {wave} requests, then the "
                f"trace's arrivals at the measured completion rate, for ~{100 * self.target:.0f}% busy slots "
                "under continuous batching (held under static)")
        if self._speed_time > 0:
            text += (f"; played at {self._speed_min:.2g}-{self._speed_max:.2g}x its recorded pace "
                     f"(mean {self._speed_sum / self._speed_time:.2g}x)")
        return text

    def summary(self) -> dict:
        mean = self._speed_sum / self._speed_time if self._speed_time else None
        return {"kind": "closed-loop", "target_slot_utilization": self.target, "first_wave": self.first_wave,
                "speed_mean": mean, "speed_min": self._speed_min, "speed_max": self._speed_max}
