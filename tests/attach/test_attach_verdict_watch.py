"""The verdict over a whole watch: its history (a watch that ends as its load drains still says what
held while the load ran), ticks without a fresh scrape, and a URL that is not one server."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from batchtop.core_engine.attach.record.record import recorded_ticks
from batchtop.core_engine.trace.trace import read_trace
from batchtop.tui.cli import main
from tests.attach.test_attach_verdict import slot_bound
from tests.support.attach_helpers import DATA
from tests.support.scripted_vllm import Tick, scripted_server


def test_a_watch_that_ends_as_the_load_drains_still_says_what_held_while_it_ran(tmp_path):
    """The live run of vLLM with 4 slots under 32 clients ended one scrape after the queue emptied:
    the final verdict is the drain's, the history and 'held longest' say SLOTS for the 30 s of load."""
    from batchtop.core_engine.attach.record.record import monitor_for
    trace = read_trace(str(DATA / "attach-vllm-0.32-cpu-4slots-32clients-drained.jsonl.gz"))
    monitor = monitor_for(trace)
    for t, results in recorded_ticks(trace):
        frame = monitor.feed(results, t)
    assert frame.verdict.kind == "unclear" and "full, nothing waits yet" in frame.verdict.line
    stretches = monitor.tracker.stretches
    assert [s.kind for s in stretches][:3] == ["watching", "idle", "slots"]
    slots = stretches[2]
    assert slots.from_t == pytest.approx(21, abs=1) and slots.seconds >= 25 and "ceiling of 4, inferred" in slots.line
    assert monitor.tracker.longest() == slots  # not the 16 s idle before the load
    from batchtop.tui.cli.attach import verdict_lines
    end, held = verdict_lines(monitor, frame)
    assert end.startswith("verdict: full, nothing waits yet") and held.startswith("held longest: slots for 30 s of 52 s")
    assert "ceiling of 4, inferred" in held and held.endswith("or add replicas")
    assert all(a.to_t <= b.from_t for a, b in zip(stretches, stretches[1:]))


def test_the_headless_json_and_lines_carry_the_verdict_history(tmp_path):
    out = tmp_path / "attach.json"
    ticks = slot_bound(8) + [Tick(0, 0, kv=0.0)] * 400  # the load, then nothing till the watch ends
    with scripted_server(ticks) as url:
        result = CliRunner().invoke(main, ["attach", url, "--headless", "--duration", "4", "--interval", "0.1",
                                           "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    bounds = [s["bound"] for s in doc["verdict_history"]]
    assert doc["verdict"]["bound"] not in ("slots", "watching") and "slots" in bounds, bounds
    slots = doc["verdict_history"][bounds.index("slots")]
    assert slots["seconds"] == pytest.approx(slots["to_s"] - slots["from_s"]) and slots["try"].startswith("try: raise")
    assert f"verdict: {doc['verdict']['line']}" in result.output


def test_scrapes_that_brought_nothing_new_never_confirm_a_verdict():
    """One fresh tick pointed to SLOTS; the server then went DOWN. Before: the same old scrapes were
    judged again on every DOWN tick, and SLOTS was 'confirmed' by three ticks that saw no server."""
    from batchtop.core_engine.attach.monitor import Monitor
    from batchtop.core_engine.attach.scrape.sample import parse_exposition
    from batchtop.core_engine.attach.scrape.scrape import DOWN, ScrapeResult
    from tests.support.attach_helpers import live
    from tests.support.scripted_vllm import ScriptedVllm
    server, monitor = ScriptedVllm(), Monitor(["a"], max_num_seqs=4)
    for i, tick in enumerate(slot_bound(4)):
        before = monitor.feed([live(parse_exposition(server.text(tick), float(i)))], float(i)).verdict
    assert before.kind == "watching" and before.candidate == "slots"
    down = [monitor.feed([ScrapeResult(DOWN, "refused", None, 0.0)], 4.0 + i).verdict for i in range(6)]
    assert all(v == before for v in down)


def test_two_servers_taking_turns_behind_one_url_are_bad_not_a_rate():
    """A load balancer in front of two vLLM replicas: the counters fall back on every other scrape and
    jump forward on the next. Before: 2480 generation tok/s where each server made 80."""
    from batchtop.core_engine.attach.monitor import Monitor
    from batchtop.core_engine.attach.scrape.sample import parse_exposition
    from tests.support.attach_helpers import live
    from tests.support.scripted_vllm import ScriptedVllm
    tick = Tick(4, 10, kv=0.2, steps=(4,) * 20, finished=((64, 100),))
    a, b, monitor = ScriptedVllm(), ScriptedVllm(), Monitor(["lb"])
    for _ in range(30):
        b.text(tick)  # b started earlier: its counters are ahead
    frames = []
    for i in range(16):
        a_text, b_text = a.text(tick), b.text(tick)
        frames.append(monitor.feed([live(parse_exposition(b_text if i % 2 else a_text, float(i)))], float(i)))
    late = [f.main for f in frames[8:]]
    assert all(s.status == "BAD" and s.rates.get("generation_tokens") is None for s in late)
    assert late[-1].reason.startswith("counters restarted 3 times in") and "a load balancer?" in late[-1].reason
    assert all(f.verdict.kind == "watching" for f in frames)
    from batchtop.core_engine.attach.record.workload_export import ExportError, build_workload
    with pytest.raises(ExportError, match="^lb: counters restarted 3 times .* not one server's traffic"):
        build_workload([w.session for w in monitor.windows], monitor.urls, "vllm")


def test_real_vllm_under_a_client_that_sends_batches_is_client_bound_in_batches():
    """vLLM 0.32 CPU, 16 slots, examples/batch_client.py (batches of 16, each awaited whole): running
    9, 1, 16, 11, 2, 1, 1, 0, 11, 1, ... attach came in as the first batch drained, so that batch counts
    from its drain; the next two came each as the one before had finished."""
    from batchtop.core_engine.attach.record.record import monitor_for
    trace = read_trace(str(DATA / "attach-vllm-0.32-cpu-16slots-batch-client.jsonl.gz"))
    monitor = monitor_for(trace)
    verdicts = [(t, monitor.feed(results, t).verdict) for t, results in recorded_ticks(trace)]
    settled = [v for _, v in verdicts if v.kind != "watching"]
    assert settled and {v.kind for v in settled} == {"client"}
    after_third = [v for t, v in verdicts if t >= 8]  # the third batch arrives at t = 8 s
    assert after_third and all(v.evidence["pattern"] == "barrier" for v in after_third)
    assert all(v.evidence.get("pattern") != "barrier" for t, v in verdicts if t < 8)
    last = settled[-1]
    # 16 each: at t = 8 s 11 run and 5 already finished within the scrape they arrived in
    assert last.evidence["bursts"] == 3 and last.evidence["burst_size"] == 16
    assert last.evidence["drained_to"] == 1 and last.evidence["period_s"] == pytest.approx(6, abs=0.5)
    assert "client (batches): 3 bursts of ~" in last.line and "examples/in_flight_client.py" in last.advice
