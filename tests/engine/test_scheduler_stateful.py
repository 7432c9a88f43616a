"""Hypothesis drives the engine through random add / step / abort / mode / max_num_seqs sequences
and checks the scheduler's invariants after every rule, then drains and checks that nothing leaked.

Prompts start with one of a few shared prefixes, so the prefix cache shares, frees, finds again and
evicts blocks all the time in a pool this small: every cached block must still hold what its key says.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from batchtop.core_engine.engine import control
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.kv_cache import CACHED
from batchtop.core_engine.sched.prefix_cache import ROOT_DIGEST, block_digest
from batchtop.core_engine.errors import UnservableRequest
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.sched.static import kv_tokens_for_whole_request
from batchtop.core_engine.sched.wait_reason import WaitKind
from tests.conftest import tiny_config

NUM_BLOCKS, BLOCK_SIZE = 12, 4
PREFIXES = ((), (7, 1, 7, 2, 9, 3, 9, 4, 5), (7, 1, 7, 2, 9, 3, 9, 4, 6, 6, 6, 6, 8))  # the last two share 2 blocks


def chain_digest(tokens: tuple[int, ...]) -> bytes:
    """The key of the last full block of `tokens`, computed from scratch."""
    digest = ROOT_DIGEST
    for i in range(0, len(tokens) - len(tokens) % BLOCK_SIZE, BLOCK_SIZE):
        digest = block_digest(digest, tokens[i:i + BLOCK_SIZE])
    return digest


def check_wait_reason(sched, plan) -> None:
    """The published reason names a limit the head of the queue really is up against."""
    reason = plan.wait_reason
    assert (reason is None) == (not sched.waiting)
    if reason is None:
        return
    head, free = sched.waiting[0], sched.allocator.num_free_blocks
    if reason.kind is WaitKind.STATIC_BATCH:
        assert sched.policy.name == "static" and sched.running
        assert plan.admitted == [] or len(plan.admitted) == sched.max_num_seqs
    elif reason.kind is WaitKind.SLOTS_FULL:
        assert sched.policy.name == "continuous" and len(sched.running) >= sched.max_num_seqs
    elif reason.kind is WaitKind.TOKEN_BUDGET:
        assert sched.policy.name == "continuous" and plan.num_tokens == plan.token_budget
    elif plan.preempted:
        assert reason.kind is WaitKind.KV_FULL
    elif sched.policy.name == "static":
        bm = sched.block_manager
        need = bm.blocks_to_admit(head, kv_tokens_for_whole_request(head), bm.cached_prefix(head))
        assert need > free and f"needs {need} blocks" in reason.message
    else:
        bm = sched.block_manager
        need = bm.blocks_to_admit(head, head.num_tokens, bm.cached_prefix(head))
        assert need + sched.admission_watermark() > free and f"needs {need} blocks" in reason.message


class EngineMachine(RuleBasedStateMachine):
    @initialize(mode=st.sampled_from(["continuous", "static"]), max_num_seqs=st.integers(1, 6),
                budget=st.integers(8, 32),  # >= the 8 slots set_max_num_seqs may ask for
                caching=st.sampled_from([True, True, True, False]))
    def start(self, mode: str, max_num_seqs: int, budget: int, caching: bool) -> None:
        self.engine = Engine(tiny_config(mode=mode, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                         num_kv_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
                                         enable_prefix_caching=caching))
        self.written: dict[int, tuple[int, ...]] = {}  # keyed block -> the tokens up to its end, as written
        self.last_cached = 0
        manager = self.engine.block_manager
        cache_blocks = manager.cache_blocks

        def cache_blocks_and_remember(seq, start, end):  # what each block is keyed with, as it is keyed
            cache_blocks(seq, start, end)
            for i in range(start // BLOCK_SIZE, end // BLOCK_SIZE):
                b = seq.block_table[i]
                if manager.allocator.cache.digest_of(b) == seq.block_digests[i]:
                    self.written[b] = tuple(seq.token_ids[:(i + 1) * BLOCK_SIZE])

        if caching:
            manager.cache_blocks = cache_blocks_and_remember
        self.expected: dict[str, int] = {}  # accepted request id -> max_tokens
        self.aborted: set[str] = set()
        self.outputs: dict[str, int] = {}
        self.steps = 0
        self.n = 0
        self.decision: tuple | None = None
        schedule = self.engine.scheduler.schedule

        def schedule_and_check():  # the reason must be true of the state the scheduler decided in
            plan = schedule()
            check_wait_reason(self.engine.scheduler, plan)
            event(f"head waits: {plan.wait_reason.kind.value if plan.wait_reason else 'no'}")
            return plan

        self.engine.scheduler.schedule = schedule_and_check

    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(0, 3), max_size=20),
          max_tokens=st.integers(1, 30))
    def add(self, prefix: tuple[int, ...], tail: list[int], max_tokens: int) -> None:
        rid = f"q{self.n}"
        self.n += 1
        prompt = prefix + tuple(tail) or (1,)
        prompt_len = len(prompt)
        try:
            self.engine.add_request(Request(rid, prompt, max_tokens))
        except UnservableRequest:
            assert -(-(prompt_len + max_tokens - 1) // BLOCK_SIZE) > NUM_BLOCKS  # refused only if it can never fit
            return
        self.expected[rid] = max_tokens

    @rule()
    def step(self) -> None:
        snap = self.engine.step()
        if snap.is_step:
            self.steps += 1
            if snap.mode == "continuous":
                assert snap.num_tokens <= snap.max_num_batched_tokens
            if snap.preempted:
                event("preemption")
            if snap.counters.cached_tokens > self.last_cached:
                event("prefix cache hit")
            self.last_cached = snap.counters.cached_tokens
            if snap.num_padding_tokens:
                event("static padding")
            for f in snap.finished:
                self.outputs[f.request_id] = f.num_generated

    @precondition(lambda self: self.expected)
    @rule(data=st.data())
    def abort(self, data) -> None:
        rid = data.draw(st.sampled_from(sorted(self.expected)))
        self.engine.apply(control.Abort(rid))
        if rid not in self.outputs:
            self.aborted.add(rid)

    @rule(mode=st.sampled_from(["continuous", "static"]))
    def set_mode(self, mode: str) -> None:
        self.engine.apply(control.SetMode(mode))

    @rule(value=st.integers(1, 8))
    def set_max_num_seqs(self, value: int) -> None:
        running = len(self.engine.scheduler.running)
        self.engine.apply(control.SetMaxNumSeqs(value))
        assert len(self.engine.scheduler.running) == running  # lowering drops nobody

    @invariant()
    def scheduler_is_consistent(self) -> None:
        self.engine.scheduler.check_invariants()

    @invariant()
    def cached_blocks_hold_what_their_keys_say(self) -> None:
        """Every block with a key, held or free, holds the tokens its key names: the tokens written
        there (remembered as it was keyed), never another prefix's."""
        engine = self.engine
        alloc = engine.allocator
        if alloc.cache is None:
            assert all(r in (0, 1) for r in alloc.block_refs())
            return
        refs = alloc.block_refs()
        for b in range(NUM_BLOCKS):
            digest = alloc.cache.digest_of(b)
            if digest is None:
                if self.written.pop(b, None) is not None:  # only handing it out again drops a key
                    event("cached block evicted")
                continue
            assert b in self.written, f"block {b} is keyed but no sequence ever held it keyed"
            assert digest == chain_digest(self.written[b]), f"block {b}'s key names other tokens"
            assert refs[b] == (alloc.ref_count(b) or CACHED)
            if refs[b] > 1:
                event("block shared")

    def teardown(self) -> None:
        engine = self.engine
        limit = sum(self.expected.values()) * 4 + 60 * len(self.expected) + 10
        for _ in range(limit):
            if engine.is_done():
                break
            snap = engine.step()
            if snap.is_step:
                for f in snap.finished:
                    self.outputs[f.request_id] = f.num_generated
        assert engine.is_done(), "the engine did not drain"
        assert not engine.scheduler.running and not engine.scheduler.waiting
        alloc = engine.allocator
        assert alloc.num_free_blocks == NUM_BLOCKS  # free + cached = total: nothing leaked
        assert all(alloc.ref_count(b) == 0 for b in range(NUM_BLOCKS))
        assert alloc.num_cached_free_blocks == sum(r == CACHED for r in alloc.block_refs())
        alloc.check_invariants()
        for rid, max_tokens in self.expected.items():
            if rid not in self.aborted:
                assert self.outputs.get(rid) == max_tokens, rid


EngineMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])
TestEngineMachine = EngineMachine.TestCase
