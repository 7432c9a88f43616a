"""A field added to a snapshot dataclass is recorded, read back and checked with no other file touched:
the trace codec and schema take their field lists from the dataclasses (core_engine/trace/layout.py).

The dataclasses are swapped for subclasses with one throwaway field each in a fresh interpreter, before
any trace module is imported, as an edit of snapshot.py would leave them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from batchtop.core_engine.trace.field_types import field_type

ROOT = Path(__file__).resolve().parents[2]
OLD_TRACE = ROOT / "tests" / "data" / "trace-before-prefix-caching.jsonl"

WITH_NEW_FIELDS = r'''
import dataclasses, json, sys
import batchtop.core_engine.engine.snapshot as snapshot
from batchtop.core_engine.model.cost import StepCost
from batchtop.core_engine.sched.request import Phase

def grown(base, name, tp, default):
    cls = dataclasses.make_dataclass(base.__name__, [(name, tp, dataclasses.field(default=default))],
                                     bases=(base,), frozen=True, slots=True)
    setattr(snapshot, base.__name__, cls)
    return cls

StepSnapshot = grown(snapshot.StepSnapshot, "draft_tokens", tuple[int, ...], ())
SlotView = grown(snapshot.SlotView, "num_drafted", int, 0)
WaitingView = grown(snapshot.WaitingView, "priority", int, 0)
FinishedRequest = grown(snapshot.FinishedRequest, "num_accepted", int, 0)
Counters = grown(snapshot.Counters, "drafted_tokens", int, 0)

from batchtop.core_engine.trace.trace import Recorder, TraceError, read_trace  # only now: as if snapshot.py said so

out, trace_dir = {}, sys.argv[1]
arrived = WaitingView("r0", 0, 5, 3, 0.0, 0, priority=2)
first = StepSnapshot(
    step=1, t=0.5, mode="continuous", max_num_seqs=2, max_num_batched_tokens=64, step_time_s=0.1, schedule_s=0.01,
    prepare_s=0.01, forward_s=0.08, num_prefill_tokens=5, num_decode_tokens=0, num_padding_tokens=0, num_seqs=1,
    slots=(SlotView(0, Phase.PREFILL, "r0", 0, 5, 5, 1, 3, num_drafted=4), SlotView(1, Phase.EMPTY)),
    block_owners=(0, 0, -1, -1), num_free_blocks=2, waiting=(), num_waiting=0, wait_reason=None,
    num_pending_arrivals=0, finished=(), admitted=("r0",), preempted=(), rejected=(),
    counters=Counters(submitted=1, steps=1, prompt_tokens=5, generated_tokens=1, computed_tokens=5, drafted_tokens=4),
    arrived=(arrived,), cost=StepCost(1e6, 2e5), draft_tokens=(7, 8, 9))
done = FinishedRequest("r0", 0, 5, 2, 0.0, 0.5, 0.9, 0, "length", num_accepted=1)
second = dataclasses.replace(first, step=2, t=0.9, num_prefill_tokens=0, num_decode_tokens=1, admitted=(), arrived=(),
                             slots=(SlotView(0, Phase.FINISHED, "r0", 0, 5, 6, 2, 3), SlotView(1, Phase.EMPTY)),
                             finished=(done,), draft_tokens=(), decode_cost=first.cost)
path = f"{trace_dir}/new.jsonl"
recorder = Recorder(path, {"config": {}, "peaks": None})
recorder.record(first)
recorder.record(second)
recorder.close()
read = [snap for _, snap in read_trace(path).snapshots() if snap is not None]
out["read_back_equal"] = read == [first, second]
out["read_back"] = [[s.draft_tokens, s.slots[0].num_drafted, s.counters.drafted_tokens] for s in read]
out["arrived_priority"] = read[0].arrived[0].priority
out["num_accepted"] = read[1].finished[0].num_accepted
lines = [json.loads(line) for line in open(path)]
out["step_keys"] = [sorted(set(e) & {"draft_tokens"}) for e in lines if e["type"] == "step"]

old = [snap for _, snap in read_trace(sys.argv[2]).snapshots() if snap is not None]
out["old_trace"] = [len(old), {s.draft_tokens for s in old} == {()}, {s.counters.drafted_tokens for s in old} == {0},
                    {v.num_drafted for s in old for v in s.slots} == {0}]

bad = f"{trace_dir}/bad.jsonl"
with open(bad, "w") as f:
    f.writelines(json.dumps({**e, "draft_tokens": [7, "x"]} if e["type"] == "step" else e) + "\n" for e in lines)
try:
    read_trace(bad)
    out["bad"] = None
except TraceError as exc:
    out["bad"] = str(exc)
print(json.dumps(out))
'''


def test_a_field_added_to_the_snapshot_dataclasses_round_trips_through_a_trace(tmp_path):
    result = subprocess.run([sys.executable, "-c", WITH_NEW_FIELDS, str(tmp_path), str(OLD_TRACE)],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["read_back"] == [[[7, 8, 9], 4, 4], [[], 0, 4]]
    assert out["read_back_equal"]  # every other field too
    assert out["arrived_priority"] == 2 and out["num_accepted"] == 1
    assert out["step_keys"] == [["draft_tokens"], []]  # at its default it costs a step nothing
    assert out["old_trace"] == [13, True, True, True]  # a trace from before the fields reads them as defaults
    assert out["bad"] is not None and out["bad"].endswith(":3: step event: field draft_tokens [1] must be an integer "
                                                          ">= 0 and at most 9007199254740992, got 'x'")


def test_a_field_of_a_type_the_trace_cannot_hold_is_named_at_import():
    with pytest.raises(TypeError, match=r"StepSnapshot\.when: a <class 'complex'> has no form in a trace"):
        field_type(complex, "StepSnapshot.when")
    assert field_type(tuple[str, int]).decode(["a", 1]) == ("a", 1)
