"""Recorded sessions: round trips, damaged files, scripted demos, replay in the dashboard."""

from __future__ import annotations

import gzip
import json

import pytest
from click.testing import CliRunner

from batchtop.core_engine.config import config_from_dict
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.model.cost import StepCost
from batchtop.core_engine.run.headless import run_workload
from batchtop.core_engine.run.script import ScriptAction, ScriptPlayer, load_script
from batchtop.core_engine.run.live_session import Session
from batchtop.core_engine.trace.trace import Recorder, TraceError, read_trace
from tests.conftest import fail_on_call, make_requests, tiny_config
from tests.tui.test_dashboard import TickClock, WORKLOAD, make_app, panel_text, step, wait_for
from batchtop.tui.cli import main
from batchtop.tui.cli.replay import replay_metrics
from batchtop.tui.app import BatchtopApp
from batchtop.tui.sources.replay import ReplaySource
from batchtop.tui.widgets.engine.kv_blocks import KVBlocksPanel
from batchtop.tui.widgets.engine.slots import SlotsPanel
from batchtop.tui.widgets.engine.waiting import WaitingPanel

TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32"]
HEADER = {"config": tiny_config().as_dict(), "device": {"kind": "cpu", "name": "test"}, "peaks": None,
          "workload": {"num_requests": 10}}


def record_headless(tmp_path, name: str, *extra: str) -> tuple[str, dict]:
    trace, out = tmp_path / name, tmp_path / f"{name}.metrics.json"
    result = CliRunner().invoke(main, ["--headless", *TINY, "--num-requests", "20", "--time-scale", "0",
                                       "--num-kv-blocks", "24", "--record", str(trace), "-o", str(out), *extra])
    assert result.exit_code == 0, result.output
    return str(trace), json.loads(out.read_text())


@pytest.mark.parametrize("name", ["run.jsonl", "run.jsonl.gz"])
def test_a_headless_recording_replays_to_the_same_metrics(tmp_path, name):
    trace, original = record_headless(tmp_path, name)
    assert original["preemptions"] > 0  # a small pool: the trace has preemptions to replay too
    out = tmp_path / "replayed.json"
    result = CliRunner().invoke(main, ["replay", trace, "--headless", "-o", str(out)])
    assert result.exit_code == 0, result.output
    replayed = json.loads(out.read_text())
    for key in ("requests", "tokens", "steps", "preemptions"):
        assert replayed[key] == original[key], key
    assert {k: v for k, v in replayed.items() if k != "replayed_from"} == original
    if name.endswith(".gz"):
        assert gzip.open(trace).read(1) == b"{"


def test_re_feeding_a_traces_inputs_reproduces_every_scheduling_decision(tmp_path):
    trace = read_trace(record_headless(tmp_path, "run.jsonl")[0])
    engine = Engine(config_from_dict(trace.header["config"]))  # the same engine; prompts need only lengths
    decisions = mixed = 0
    for event, recorded in trace.snapshots():
        if event["type"] == "arrival":
            # a first token of its own: as the recorded random prompts, no two share a prefix-cache block
            prompt = (1 + event["index"],) + (1,) * (event["prompt_len"] - 1)
            engine.add_request(Request(event["id"], prompt, event["max_tokens"]), arrival_s=event["arrival_s"])
        elif event["type"] == "step":
            snap = engine.step()
            assert (snap.admitted, snap.preempted, snap.block_owners) == \
                (recorded.admitted, recorded.preempted, recorded.block_owners), f"step {recorded.step}"
            assert [(s.index, s.phase, s.num_computed) for s in snap.slots] == \
                [(s.index, s.phase, s.num_computed) for s in recorded.slots]
            assert (snap.cost, snap.decode_cost) == (recorded.cost, recorded.decode_cost), f"step {recorded.step}"
            mixed += snap.decode_cost not in (snap.cost, StepCost())
            decisions += 1
        else:
            assert event["type"] in ("finish", "end"), event  # no controls or rejections in this run
    assert decisions > 50 and engine.is_done()
    assert engine.counters.preemptions > 0 and mixed > 0  # and steps with decode rows beside a prompt chunk


def test_what_happens_after_the_last_step_replays_too(tmp_path):
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"id": "a", "prompt_len": 3, "max_tokens": 3}\n{"id": "b", "prompt_len": 4, "max_tokens": 2}\n'
                        '{"id": "huge", "prompt_len": 40, "max_tokens": 10, "arrival_s": 0.25}\n')
    trace, original = record_headless(tmp_path, "late.jsonl", "--workload", str(workload), "--num-kv-blocks", "4",
                                      "--block-size", "4", "--time-scale", "1")
    assert original["requests"] == {"submitted": 3, "completed": 2, "rejected": 1}
    assert original["wall_time_s"] >= 0.25  # the engine idled until the refused request arrived
    out = tmp_path / "replayed.json"
    assert CliRunner().invoke(main, ["replay", trace, "--headless", "-o", str(out)]).exit_code == 0
    replayed = json.loads(out.read_text())
    assert {k: v for k, v in replayed.items() if k != "replayed_from"} == original


def test_every_line_is_an_ordered_event_and_the_file_ends_cleanly(tmp_path):
    trace, _ = record_headless(tmp_path, "run.jsonl")
    lines = [json.loads(x) for x in open(trace, encoding="utf-8")]
    assert lines[0]["format"] == "batchtop.trace" and lines[0]["version"] == 1
    assert [e["seq"] for e in lines] == list(range(len(lines)))
    assert all(a["t"] <= b["t"] for a, b in zip(lines, lines[1:]))
    assert lines[-1] == {**lines[-1], "type": "end", "reason": "finished"}
    kinds = {e["type"] for e in lines}
    assert {"arrival", "step", "finish"} <= kinds


def test_a_truncated_last_line_is_dropped_with_a_warning(tmp_path):
    trace, _ = record_headless(tmp_path, "run.jsonl")
    data = open(trace, "rb").read()
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(data[: data.rstrip(b"\n").rfind(b"\n") + 30])  # half of the last event survives
    result = CliRunner().invoke(main, ["replay", str(cut), "--headless"])
    assert result.exit_code == 0
    assert "dropped a truncated last line" in result.stderr and "did not close cleanly" in result.stderr
    assert json.loads(result.stdout)["complete"] is False


def test_a_gzip_trace_cut_short_by_a_crash_still_reads(tmp_path):
    trace, original = record_headless(tmp_path, "run.jsonl.gz")
    data = open(trace, "rb").read()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) * 2 // 3])
    loaded = read_trace(str(cut))
    assert loaded.warnings and 0 < len(loaded.events)
    assert replay_metrics(loaded)["steps"] < original["steps"]


def test_a_corrupt_line_in_the_middle_is_an_error_naming_the_line(tmp_path):
    trace, _ = record_headless(tmp_path, "run.jsonl")
    lines = open(trace, encoding="utf-8").read().splitlines(keepends=True)
    lines[5] = '{"seq": 5, "type": "arr\n'
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(lines))
    result = CliRunner().invoke(main, ["replay", str(bad), "--headless"])
    assert result.exit_code == 2 and f"{bad}:6: corrupt line" in result.output


@pytest.mark.parametrize("header,message", [
    ({"seq": 0, "t": 0, "type": "header", "format": "cb-trace", "version": 1}, "not a batchtop trace"),
    ({"seq": 0, "t": 0, "type": "header", "format": "batchtop.trace", "version": 2}, "version 2 is newer"),
    ({"seq": 0, "t": 0, "type": "header", "format": "batchtop.trace", "version": 0}, "unknown trace version 0"),
    ({"seq": 0, "t": 0, "type": "header", "format": "batchtop.trace"}, "unknown trace version None"),
])
def test_unknown_formats_and_newer_versions_are_refused(tmp_path, header, message):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(header) + "\n")
    result = CliRunner().invoke(main, ["replay", str(path), "--headless"])
    assert result.exit_code == 2 and message in result.output and f"{path}:1" in result.output


def test_events_out_of_order_are_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    events = [{"seq": 0, "t": 0, "type": "header", "format": "batchtop.trace", "version": 1},
              {"seq": 2, "t": 0, "type": "control", "name": "pause"},
              {"seq": 1, "t": 0, "type": "control", "name": "resume"}]
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    with pytest.raises(TraceError, match=r":3: seq 1 after 2"):
        read_trace(str(path))


@pytest.mark.parametrize("name", ["live.jsonl", "live.jsonl.gz"])
def test_a_recording_is_readable_while_it_is_still_being_written(tmp_path, name):
    path = str(tmp_path / name)
    engine = Engine(tiny_config())
    engine.load_workload(make_requests(6))
    recorder = Recorder(path, HEADER)
    for _ in range(5):
        recorder.record(engine.step())
    partial = read_trace(path)  # the writer has neither closed nor crashed: every step is there
    assert sum(1 for e in partial.events if e["type"] == "step") == 5
    recorder.close()
    assert read_trace(path).ended_cleanly


def test_an_engine_crash_leaves_an_error_event_and_a_readable_trace(tmp_path, monkeypatch):
    from batchtop.core_engine.worker.model_runner import ModelRunner
    monkeypatch.setattr(ModelRunner, "run", fail_on_call(ModelRunner.run, 4, "simulated fault"))
    trace = tmp_path / "crash.jsonl"
    result = CliRunner().invoke(main, ["--headless", *TINY, "--num-requests", "8", "--time-scale", "0",
                                       "--record", str(trace)])
    assert result.exit_code == 1
    loaded = read_trace(str(trace))
    assert [e["type"] for e in loaded.events[-2:]] == ["error", "end"]
    assert "simulated fault" in loaded.events[-2]["message"] and loaded.events[-1]["reason"] == "error"
    assert replay_metrics(loaded)["steps"] == 3


def test_a_scripted_demo_applies_its_actions_at_the_right_steps(tmp_path):
    clock = TickClock()  # 1 ms per reading: a step is a few ms of engine time
    engine = Engine(tiny_config(max_num_seqs=4), clock=clock)
    actions = [ScriptAction(0.0, mode="static", max_num_seqs=2, caption="static first"),
               ScriptAction(0.15, mode="continuous", caption="now continuous"),
               ScriptAction(0.3, max_num_seqs=3, burst=5),
               ScriptAction(0.6, quit=True)]
    path = str(tmp_path / "demo.jsonl")
    session = Session(engine, WORKLOAD * 1, recorder=Recorder(path, HEADER), script=ScriptPlayer(actions))
    result = run_workload(engine, make_requests(40, output=(10, 20)), session)
    assert result.stopped_by_script
    events = read_trace(path).events
    steps = [e for e in events if e["type"] == "step"]
    assert steps[0]["mode"] == "static" and steps[0]["max_num_seqs"] == 2
    switch = next(i for i, e in enumerate(events) if e["type"] == "control" and e.get("value") == "continuous")
    first_after = next(e for e in events[switch:] if e["type"] == "step")
    last_before = [e for e in events[:switch] if e["type"] == "step"][-1]
    def started(e):
        return e["run_t"] - e["times"][0]

    assert last_before["mode"] == "static" and started(last_before) < 0.15
    assert first_after["mode"] == "continuous" and started(first_after) >= 0.15
    burst = next(e for e in events if e["type"] == "control" and e["name"] == "burst")
    assert burst["value"] == 5 and [e["value"] for e in events if e["type"] == "control" and e["name"] == "caption"] \
        == ["static first", "now continuous"]
    assert started(steps[-1]) < 0.6 <= steps[-1]["run_t"] + 0.01
    assert events[-1] == {**events[-1], "type": "end", "reason": "script quit"}


def test_the_bundled_teaching_demo_is_valid_and_bad_scripts_are_named(tmp_path):
    from batchtop.tui.cli.options import DEMOS_DIR
    actions = load_script("teaching", DEMOS_DIR)
    assert actions[0].mode == "static" and actions[-1].quit and all(a.caption for a in actions[:-1])
    bad = tmp_path / "bad.json"
    bad.write_text('[{"at": 0, "mdoe": "static"}]')
    result = CliRunner().invoke(main, ["--headless", *TINY, "--script", str(bad)])
    assert result.exit_code == 2 and f"{bad}: action 1: unknown key(s) mdoe" in result.output


async def test_replay_in_the_dashboard_reaches_the_same_final_panels_as_the_live_run(tmp_path):
    path = str(tmp_path / "ui.jsonl.gz")
    live = make_app()
    live.source.session.recorder = Recorder(path, {**HEADER, "workload": {"num_requests": len(WORKLOAD)}})
    async with live.run_test(size=(120, 36)) as pilot:
        await step(pilot, 3)
        await pilot.press("s")
        await step(pilot, 4)
        final = {panel: panel_text(live, panel) for panel in (SlotsPanel, KVBlocksPanel, WaitingPanel)}
        await pilot.press("q")
    trace = read_trace(path)
    assert trace.ended_cleanly
    replay = BatchtopApp(ReplaySource(trace, start_paused=True))
    async with replay.run_test(size=(120, 36)) as pilot:
        await pilot.press("G")
        await wait_for(pilot, lambda: replay.source.frame.state == "paused" and replay.source.pos == len(trace.events))
        assert {panel: panel_text(replay, panel) for panel in final} == final
        assert "REPLAY" in replay.source.position() and "step 7/7" in replay.source.position()
        await pilot.press("g")
        await wait_for(pilot, lambda: replay.source.pos == 0)
        await pilot.press("n")
        await wait_for(pilot, lambda: "step 1/7" in replay.source.position())
