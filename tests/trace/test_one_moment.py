"""One frame, one moment: every slot, the block map, the status and the metrics describe the end of the
same step. A sequence that finished in a step is shown finished (its KV freed) in that very snapshot,
live and replayed, and a trace written before the FINISHED phase replays the same way."""

from __future__ import annotations

import json

import pytest

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.run.headless import run_workload
from batchtop.core_engine.run.live_session import Session
from batchtop.core_engine.trace.trace import Recorder
from batchtop.core_engine.engine.snapshot import HOLDING_PHASES, WORKING_PHASES, StepSnapshot
from batchtop.core_engine.sched.kv_cache import FREE
from batchtop.core_engine.sched.request import Phase
from batchtop.core_engine.serve.exporter import num_running
from batchtop.core_engine.trace.codec import PHASE_CODE, SnapshotDecoder
from batchtop.core_engine.trace.trace import read_trace
from batchtop.core_engine.run.frame import FrameBuilder
from tests.conftest import make_requests, tiny_config

POOL = 48  # blocks of 4 tokens: 16 slots of up to 80-token requests preempt under continuous batching


def record(tmp_path, mode: str, num_kv_blocks: int, *, prefix_caching: bool = False
           ) -> tuple[list[StepSnapshot], list[StepSnapshot], dict]:
    """Run 60 requests all at once through a Session that records them: (live steps, the same steps read
    back from the trace, metrics). The live ones are what the engine published; the replayed ones went
    through the trace codec."""
    config = tiny_config(mode=mode, max_num_seqs=16, max_num_batched_tokens=128, num_kv_blocks=num_kv_blocks,
                         enable_prefix_caching=prefix_caching)
    requests = make_requests(60, seed=7, prompt=(1, 40), output=(1, 40))
    engine = Engine(config)
    path = tmp_path / f"{mode}.jsonl"
    recorder = Recorder(str(path), {"config": config.as_dict(), "device": {"kind": "cpu", "name": "test"},
                                    "peaks": None, "workload": {"num_requests": len(requests)}})
    live: list[StepSnapshot] = []
    result = run_workload(engine, requests, Session(engine, requests, recorder=recorder),
                          on_step=lambda snap: live.append(snap) if snap.is_step else None)
    assert result.complete and result.error is None
    replayed = [snap for _, snap in read_trace(str(path)).snapshots() if snap is not None and snap.is_step]
    assert len(replayed) == len(live)
    return live, replayed, result.collector.summary(config.as_dict())


def check_one_moment(snaps: list[StepSnapshot], pool: int, *, exact_owners: bool) -> None:
    """exact_owners: without a prefix cache every used block has one holder, so the holders seen in the
    block map are exactly the sequences the slots show holding."""
    done: set[int] = set()  # requests that have sampled their last token
    for snap in snaps:
        done |= {f.index for f in snap.finished}
        owners = set(snap.block_owners) - {FREE}
        holding = {s.index for s in snap.slots if s.phase in HOLDING_PHASES}
        finished = {s.index for s in snap.slots if s.phase is Phase.FINISHED}
        assert finished <= done, f"step {snap.step}: shown finished before its last token"
        assert not finished & owners, f"step {snap.step}: a finished slot still owns KV blocks"
        padding = {s.index for s in snap.slots if s.phase is Phase.PADDING}
        assert padding <= done and not (holding - padding) & done, f"step {snap.step}: a finished one at work"
        if exact_owners:
            assert holding == owners, f"step {snap.step}: slots hold {holding}, blocks are owned by {owners}"
        else:  # shared prefix blocks belong to their oldest holder: a holder owns none only if it shares all
            assert owners <= holding | {f.index for f in snap.finished} and (not holding or owners)
        working = [s for s in snap.slots if s.phase in WORKING_PHASES]
        assert all(s.index in owners for s in working) or not exact_owners
        if snap.num_free_blocks == pool:  # the pool is empty: nothing may be shown at work
            assert not working and not holding, f"step {snap.step}: slots at work beside an empty pool"
        # the exporter's running count, the slot grid's busy count and the holders agree
        assert num_running(snap) == len([s for s in snap.slots if s.phase in (*WORKING_PHASES, Phase.IDLE)])
    last = snaps[-1]
    assert last.num_free_blocks == pool and not [s for s in last.slots if s.phase in HOLDING_PHASES]


@pytest.mark.parametrize("mode", ["static", "continuous"])
def test_no_step_shows_a_slot_at_work_that_holds_no_kv_live_or_recorded(tmp_path, mode):
    live, replayed, metrics = record(tmp_path, mode, POOL)
    if mode == "continuous":
        assert metrics["preemptions"] > 0  # a small pool: preemption by recompute happens too
    for snaps in (live, replayed):
        check_one_moment(snaps, POOL, exact_owners=True)
        # every request that finished was shown finished, in the step it finished in
        shown = {s.index for snap in snaps for s in snap.slots if s.phase is Phase.FINISHED}
        assert shown == {f.index for snap in snaps for f in snap.finished}


def test_with_a_prefix_cache_too(tmp_path):
    for snaps in record(tmp_path, "continuous", POOL, prefix_caching=True)[:2]:
        check_one_moment(snaps, POOL, exact_owners=False)


def test_the_metrics_count_the_same_work_as_before_the_finished_phase(tmp_path):
    """A sequence's last step was useful work (it sampled a token), a static batch's last padding rows were
    not: slot_utilization and padding_share are unchanged by showing the end-of-step state."""
    snaps, _, metrics = record(tmp_path, "static", 512)
    useful = padding = capacity = 0
    for snap in snaps:
        last = {f.index for f in snap.finished}
        capacity += len(snap.slots)
        useful += sum(s.phase in WORKING_PHASES or (s.phase in (Phase.FINISHED, Phase.PADDING) and s.index in last)
                      for s in snap.slots)
        padding += sum(s.phase in (Phase.FINISHED, Phase.PADDING) and s.index not in last for s in snap.slots)
    assert metrics["slot_utilization"] == pytest.approx(useful / capacity)
    assert metrics["padding_share"] == pytest.approx(padding / capacity)
    assert useful + padding == sum(s.num_seqs for s in snaps)  # every computed row, once


def as_before_the_finished_phase(events: list[dict]) -> list[dict]:
    """The same trace as batchtop wrote it when slots showed what they did in the step: a sequence that
    finished in it as decoding (prefill, for a one-token answer), a static batch's released padding as padding."""
    out, finished = [], set()
    for event in events:
        if event["type"] == "finish":
            finished.add(event["index"])
        if event["type"] in ("step", "view"):
            event = dict(event, slots=[cell if cell == 0 else _old_cell(cell, finished) for cell in event["slots"]])
            finished = set()
        out.append(event)
    return out


def _old_cell(cell: list, finished: set[int]) -> list:
    index, code, computed, generated, *extra = cell
    if index in finished and code in ("f", "x"):
        code = "p" if generated == 1 else "d"
    elif code == "f":
        code = "x"
    return [index, code, computed, generated, *extra]


@pytest.mark.parametrize("mode", ["static", "continuous"])
def test_an_old_trace_replays_in_the_same_moment(tmp_path, mode):
    record(tmp_path, mode, POOL)
    lines = [json.loads(line) for line in open(tmp_path / f"{mode}.jsonl", encoding="utf-8")]
    events = lines[1:]
    assert any("f" in [c[1] for c in e["slots"] if c] for e in events if e["type"] == "step")
    old = as_before_the_finished_phase(events)
    assert not any("f" in [c[1] for c in e["slots"] if c] for e in old if e["type"] == "step")
    new_decoder, old_decoder = SnapshotDecoder(), SnapshotDecoder()
    compared = 0
    for new_event, old_event in zip(events, old):
        a, b = new_decoder.feed(new_event), old_decoder.feed(old_event)
        if a is not None:
            assert [s.phase for s in b.slots] == [s.phase for s in a.slots], f"step {a.step}"
            assert b.slot_states() == a.slot_states()
            compared += 1
    assert compared > 20


def test_the_last_frame_of_a_run_is_finished_everywhere(tmp_path):
    """The issue's end of a run: status finished, KV 0 used, and no slot still shown busy (● 256/256)."""
    snaps = record(tmp_path, "continuous", 512)[0]
    builder = FrameBuilder()
    for snap in snaps:
        builder.observe(snap)
    frame = builder.frame("finished")
    last = frame.snapshot
    assert last.num_used_blocks == 0 and last.num_running == 0
    assert all(s.phase in (Phase.EMPTY, Phase.FINISHED) for s in last.slots)
    assert frame.metrics.completed == frame.metrics.total == 60
    assert set(PHASE_CODE.values()) >= {"f"}


def test_the_queue_reason_is_the_steps_end_too():
    """Slots full when the step began, two of them freed by its end: the Waiting panel says both."""
    engine = Engine(tiny_config(max_num_seqs=2))
    engine.load_workload(make_requests(2, seed=1, output=(1, 1)) + make_requests(3, seed=2, prefix="w"))
    first = engine.step()  # both prefill and finish at once: slots were full for the three waiting
    assert [s.phase for s in first.slots] == [Phase.FINISHED, Phase.FINISHED] and first.num_waiting == 3
    assert "2 slots freed at the end of this step" in first.wait_reason.message
    static = Engine(tiny_config(mode="static", max_num_seqs=2))
    static.load_workload(make_requests(4, seed=3, output=(1, 1)))
    assert static.step().wait_reason.short == "static batch ended: next batch next"
