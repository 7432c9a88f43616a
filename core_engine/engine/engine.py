"""The engine: one step() = drain controls -> admit arrivals -> schedule -> forward -> the scheduler's
update (tokens, stops, frees) -> publish a snapshot.

Thread model: one thread owns the engine and calls step(); any thread may call submit() and read
`latest` (a frozen StepSnapshot swapped in by reference after every step).
"""

from __future__ import annotations

import heapq
import queue
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from batchtop.core_engine.engine import control
from batchtop.core_engine.config import EngineConfig, max_num_seqs_cap
from batchtop.core_engine.engine.arrivals import ArrivalQueue, TimedFeed, WorkloadFeed
from batchtop.core_engine.engine.validation import validate_max_num_seqs, validate_request
from batchtop.core_engine.errors import InvalidRequest
from batchtop.core_engine.sched.kv_cache import BlockAllocator, BlockManager
from batchtop.core_engine.sched.request import Request, Sequence
from batchtop.core_engine.model.cost import Chunk, step_cost
from batchtop.core_engine.worker.kernel_switch import switch_in_built_kernels
from batchtop.core_engine.worker.model_runner import ModelRunner
from batchtop.core_engine.sched import Scheduler, SchedulerOutput, make_policy, policy_class
from batchtop.core_engine.sched.policies import next_mode
from batchtop.core_engine.engine.step_runner import StepRunner
from batchtop.core_engine.engine.snapshot import Counters, FinishedRequest, StepSnapshot, WaitingView
from batchtop.core_engine.model.cost import StepCost
from batchtop.core_engine.engine.snapshot_builder import (Occupant, StepEvents, StepTimes, build_snapshot, settle,
                                                           slot_occupants)

class Engine:
    def __init__(self, config: EngineConfig, runner: StepRunner | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.runner = runner if runner is not None else ModelRunner(config)
        pool_note = getattr(self.runner, "pool_note", None)
        if pool_note is not None:  # a GPU's pool, sized after a profiling forward
            config = config.with_(num_kv_blocks=self.runner.num_kv_blocks, extra={**config.extra, "kv_pool": pool_note})
        self.config = config
        self.allocator = BlockAllocator(config.num_kv_blocks, config.block_size, config.enable_prefix_caching)
        self.block_manager = BlockManager(self.allocator)
        self.scheduler = Scheduler(self.block_manager, make_policy(config.mode), config.max_num_seqs,
                                   config.max_num_batched_tokens, frozenset(config.model.eos_token_ids))
        self._clock = clock
        self._controls: queue.SimpleQueue[control.Command] = queue.SimpleQueue()
        self.feed: WorkloadFeed = TimedFeed()  # when the workload's requests arrive (a pacer may replace it)
        self.latest: StepSnapshot | None = None
        self._start_run()

    # -- run state ------------------------------------------------------------------------------
    def _start_run(self) -> None:
        self._t0: float | None = None  # the run's clock starts at its first step, not when it was built
        self._arrivals = ArrivalQueue()  # bursts and served requests; the workload's come from the feed
        self._next_index = 0
        self._known_ids: set[str] = set()
        self._live: dict[str, Sequence] = {}
        self.counters = Counters()
        self.step_rejections: list[tuple[str, str]] = []  # events since the last snapshot, taken by it
        self.step_arrivals: list[WaitingView] = []
        self.step_controls: list[tuple[str, object]] = []
        self.feed.restart()

    @property
    def clock(self) -> Callable[[], float]:
        """What the engine times itself with (a scratch engine sharing this runner shares it too)."""
        return self._clock

    def now(self) -> float:
        return 0.0 if self._t0 is None else self._clock() - self._t0

    @property
    def mode(self) -> str:
        return self.scheduler.policy.name

    @property
    def max_num_seqs(self) -> int:
        return self.scheduler.max_num_seqs

    @property
    def max_num_seqs_cap(self) -> int:
        """The most slots a live change may ask for: every running sequence's decode fits one step."""
        return max_num_seqs_cap(self.config.max_num_batched_tokens)

    def load_workload(self, requests: Iterable[Request]) -> None:
        """Requests arrive at their arrival_s (as the feed plays them); Reset replays the same list from the start."""
        self.feed.load(tuple(requests))

    def use_feed(self, feed: WorkloadFeed) -> None:
        """Play the workload through `feed` (before it is loaded): a pacer instead of its own times."""
        self.feed = feed

    # -- requests -------------------------------------------------------------------------------
    def add_request(self, request: Request, arrival_s: float | None = None) -> Sequence:
        """Queue a request now; raises InvalidRequest (bad) or UnservableRequest (can never fit)."""
        validate_request(request, self.config, self._known_ids)
        seq = Sequence(request, self._next_index, self.now() if arrival_s is None else arrival_s)
        self._next_index += 1
        self._known_ids.add(request.id)
        self._live[request.id] = seq
        self._count(submitted=1)
        self.scheduler.add(seq)
        self.step_arrivals.append(WaitingView(request.id, seq.index, request.prompt_len, request.max_tokens,
                                              seq.arrival_s, 0))
        return seq

    def _admit_arrivals(self) -> None:
        now = self.now()
        due = heapq.merge(self._arrivals.pop_due(now), self.feed.pop_due(now), key=lambda item: item[0])
        for arrival, request in due:
            try:
                self.add_request(request, arrival_s=arrival)
            except InvalidRequest as exc:  # refused alone; everyone else is still served
                self._known_ids.add(request.id)
                self._count(submitted=1, rejected=1)
                self.step_rejections.append((request.id, str(exc)))

    def _count(self, **deltas: int) -> None:
        c = self.counters
        self.counters = Counters(**{k: getattr(c, k) + deltas.get(k, 0) for k in Counters.__slots__})

    # -- control --------------------------------------------------------------------------------
    def submit(self, command: control.Command) -> None:
        """Thread-safe; validated here so a bad command fails in the caller, not in the engine."""
        if isinstance(command, control.SetMode):
            policy_class(command.mode)  # raises ValueError naming the registered modes
        if isinstance(command, control.SetMaxNumSeqs):
            validate_max_num_seqs(command.value, self.config.max_num_batched_tokens)
        self._controls.put(command)

    def apply_pending(self) -> bool:
        """Apply every queued command now (the step does this first); True if there were any."""
        applied = False
        while True:
            try:
                cmd = self._controls.get_nowait()
            except queue.Empty:
                return applied
            self.apply(cmd)
            applied = True

    def apply(self, cmd: control.Command) -> None:
        if isinstance(cmd, control.SetMode):
            if cmd.mode != self.mode:
                self.scheduler.policy = make_policy(cmd.mode)
            self.step_controls.append(("mode", cmd.mode))
        elif isinstance(cmd, control.ToggleMode):
            self.apply(control.SetMode(next_mode(self.mode)))
        elif isinstance(cmd, control.SetMaxNumSeqs):
            self.scheduler.max_num_seqs = validate_max_num_seqs(cmd.value, self.config.max_num_batched_tokens)
            self.step_controls.append(("max_num_seqs", cmd.value))
        elif isinstance(cmd, control.ChangeMaxNumSeqs):
            value = int(self.max_num_seqs * cmd.multiply) + cmd.add
            self.apply(control.SetMaxNumSeqs(max(1, min(self.max_num_seqs_cap, value))))
        elif isinstance(cmd, control.AddRequests):
            self._arrivals.push(cmd.requests, self.now() if cmd.arrival_s is None else cmd.arrival_s)
            self.step_controls.append((cmd.source, len(cmd.requests)))
        elif isinstance(cmd, control.Abort):
            seq = self.scheduler.abort(cmd.request_id)
            if seq is not None:
                self._live.pop(seq.id, None)
                self.runner.sampler.forget(seq)
            # an abort right after its AddRequests finds the request still in the arrival queue
            if seq is not None or self._arrivals.remove(cmd.request_id) or self.feed.remove(cmd.request_id):
                self.step_controls.append(("abort", cmd.request_id))
        elif isinstance(cmd, control.Reset):
            self.reset()
            self.step_controls.append(("reset", None))

    def reset(self) -> None:
        self.scheduler.reset()
        self.allocator.reset()
        self.runner.sampler.reset()
        self.latest = None
        self._start_run()

    # -- the step -------------------------------------------------------------------------------
    def is_done(self) -> bool:
        return (not self._arrivals and not len(self.feed) and not self.scheduler.has_unfinished()
                and self._controls.empty())

    def seconds_until_next_arrival(self) -> float | None:
        now = self.now()
        arrivals = [a for a in (self._arrivals.next_arrival(), self.feed.next_arrival(now)) if a is not None]
        return max(0.0, min(arrivals) - now) if arrivals else None

    def step(self) -> StepSnapshot:
        """Run one forward step. When there is nothing to run (idle until the next arrival) the
        snapshot is a view between steps: `is_step` is False and it carries only what changed."""
        marks = [self._clock()]  # start, scheduled, prepared, forward done, updated
        self._begin_step(marks[0])
        plan = self.scheduler.schedule()
        marks.append(self._clock())
        if plan.is_empty:
            return self._nothing_to_run()
        batch = self.runner.prepare(plan)
        costs = plan_costs(self.config, plan, len(batch.logits_rows))  # read before the update moves the plan on
        marks.append(self._clock())
        sampled = self.runner.run(batch)
        marks.append(self._clock())
        occupants = slot_occupants(self.scheduler.running, plan)
        finished = self.scheduler.update_from_output(plan, sampled, self.now())
        marks.append(self._clock())
        return self._end_step(plan, sampled, finished, occupants, costs, marks)

    def _begin_step(self, t_start: float) -> None:
        self.apply_pending()  # may hold a Reset, which restarts the run clock
        if switch_in_built_kernels(self.runner):  # built in the background: from this step on (see the trace)
            self.step_controls.append(("cpu_kernels", "in"))
        if self._t0 is None:
            self._t0 = t_start
        self._admit_arrivals()

    def _nothing_to_run(self) -> StepSnapshot:
        if self.scheduler.has_unfinished():  # a bug, never a state to wait in: fail loudly, not hang
            raise RuntimeError(f"scheduler made no progress with {len(self.scheduler.waiting)} waiting "
                               f"and {len(self.scheduler.running)} running")
        return self.snapshot()

    def _end_step(self, plan: SchedulerOutput, sampled: list[tuple[Sequence, int]], finished: list[Sequence],
                  occupants: list[Occupant], costs: PlanCosts, marks: list[float]) -> StepSnapshot:
        """Let go of the finished requests, count the step and publish its snapshot."""
        for seq in finished:
            self._live.pop(seq.id, None)
            self.runner.sampler.forget(seq)
        self._count(steps=1, completed=len(finished), preemptions=len(plan.preempted),
                    prompt_tokens=sum(s.prompt_len for s in plan.admitted if s.num_preemptions == 0),
                    generated_tokens=len(sampled), computed_tokens=plan.num_tokens,
                    prompt_padding_tokens=plan.num_prompt_padding, prefix_queries=plan.prefix_queries,
                    prefix_hits=plan.prefix_hits, cached_tokens=plan.cached_tokens)
        t_start, t_sched, t_prep, t_fwd, t_end = marks
        times = StepTimes(t_end - t_start, t_sched - t_start, t_prep - t_sched, t_fwd - t_prep)
        snap = self._publish(plan, [_finished_record(seq) for seq in finished], step=self.counters.steps,
                             t=t_end - self._t0, times=times, cost=costs.cost, decode_cost=costs.decode_cost,
                             occupants=settle(occupants), num_prefill_tokens=costs.num_prefill_tokens,
                             new_tokens=tuple((seq.id, token) for seq, token in sampled))
        self.feed.observe(snap)
        return snap

    def snapshot(self) -> StepSnapshot:
        """A view of the current state between steps (after a control change, while idle)."""
        return self._publish(SchedulerOutput(), [], step=0, t=self.now(), times=StepTimes(), cost=StepCost(),
                             occupants=slot_occupants(self.scheduler.running, None))

    def _publish(self, plan: SchedulerOutput, finished: list[FinishedRequest], **fields) -> StepSnapshot:
        """Freeze the state into a snapshot; it takes the events gathered since the last one."""
        events = StepEvents(tuple(self.step_arrivals), tuple(self.step_rejections), tuple(self.step_controls))
        self.step_arrivals, self.step_rejections, self.step_controls = [], [], []
        snap = build_snapshot(self.scheduler, self.allocator, self.counters, events, plan, finished,
                              num_pending_arrivals=self.num_pending_arrivals, arrival_speed=self.feed.speed,
                              **fields)
        self.latest = snap
        return snap

    @property
    def num_pending_arrivals(self) -> int:
        return len(self._arrivals) + len(self.feed)


@dataclass(frozen=True, slots=True)
class PlanCosts:
    cost: StepCost  # the whole step's FLOPs and bytes
    decode_cost: StepCost  # its decode rows as a step of their own (the whole step when nothing prefills)
    num_prefill_tokens: int


def plan_costs(config: EngineConfig, plan: SchedulerOutput, num_logit_rows: int) -> PlanCosts:
    """What the plan computes, before the update moves its sequences on; the runner decides which rows
    reach the lm_head (sampled rows, static padding rows)."""
    cost = step_cost(config.model, config.dtype, plan_chunks(plan), num_logit_rows=num_logit_rows)
    num_prefill = sum(n for seq, n in plan.scheduled if seq.is_prefill)
    return PlanCosts(cost, decode_rows_cost(config, plan) if num_prefill else cost, num_prefill)


def plan_chunks(plan: SchedulerOutput) -> list[Chunk]:
    """The plan as runs of query tokens, for the FLOP/byte accounting (before postprocess)."""
    chunks = [Chunk(seq.num_computed_tokens, n) for seq, n in plan.scheduled]
    chunks += [Chunk(seq.num_computed_tokens, 1, keys_offset=0) for seq in plan.padding]
    chunks += [Chunk(0, n) for _, n in plan.prompt_padding]
    return chunks


def decode_rows_cost(config: EngineConfig, plan: SchedulerOutput) -> StepCost:
    """The decode rows of a plan that also prefills (static batching's padding rows among them) as a step
    of their own, its prompt chunks left out; nothing when every row prefills."""
    chunks = [Chunk(seq.num_computed_tokens, 1) for seq, _ in plan.scheduled if not seq.is_prefill]
    chunks += [Chunk(seq.num_computed_tokens, 1, keys_offset=0) for seq in plan.padding]
    if not chunks:
        return StepCost()
    return step_cost(config.model, config.dtype, chunks, num_logit_rows=len(chunks))  # each row is sampled


def _finished_record(seq: Sequence) -> FinishedRequest:
    return FinishedRequest(seq.id, seq.index, seq.prompt_len, seq.num_output_tokens, seq.arrival_s,
                           seq.first_token_s, seq.finish_s, seq.num_preemptions,
                           seq.finish_reason.value, tuple(seq.token_ids[seq.prompt_len:]))
