"""A replica that exposes numbers no real server can (negative gauges, KV usage outside 0..1, the same
series twice, a counter that drops while the process did not restart) is BAD with the reason, on the
panels and in the JSON; its numbers never reach the aggregate, and a replay of a recording made
before these checks existed judges its samples the same way."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from batchtop.core_engine.attach.monitor import Monitor
from batchtop.core_engine.attach.record.record import AttachRecorder, attach_header
from batchtop.core_engine.attach.scrape.sample import BadExposition, parse_exposition
from batchtop.core_engine.attach.scrape.scrape import BAD, LIVE
from batchtop.core_engine.trace.trace import read_trace
from batchtop.tui.app import BatchtopApp
from batchtop.tui.sources.attach import AttachReplaySource
from batchtop.tui.cli import main
from batchtop.tui.widgets.attach.replicas import AttachReplicasPanel
from tests.support.attach_helpers import VLLM_T0, VLLM_T2, FlakyMetrics, flaky_server, live, restarted, vllm_sample
from tests.tui.test_attach_app import wait_for

RUNNING = 'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 8.0'
KV = 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.0068367720669026966'
PROMPT = 'vllm:prompt_tokens_total{engine="0",model_name="tiny-llama"} 384.0'


def edited(old: str, new: str, path=VLLM_T0) -> str:
    text = path.read_text(encoding="utf-8")
    assert old in text
    return text.replace(old, new)


LIES = [
    (edited(RUNNING, RUNNING.replace("8.0", "-5")),
     'negative vllm:num_requests_running{engine="0",model_name="tiny-llama"} = -5'),
    (edited(KV, KV.replace("0.0068367720669026966", "-5")), "negative vllm:kv_cache_usage_perc"),
    (edited(KV, KV.replace("0.0068367720669026966", "1.5")), "= 1.5: KV usage outside 0..1"),
    (edited(RUNNING, RUNNING + "\n" + RUNNING.replace("8.0", "1007")),
     'duplicate series vllm:num_requests_running{engine="0",model_name="tiny-llama"}'),
    (edited(PROMPT, PROMPT.replace("384.0", "-1")), "negative vllm:prompt_tokens_total"),
    # a negative series inside a positive sum, and two series whose sum no float holds
    (edited(RUNNING, RUNNING.replace("8.0", "10") + "\n" + RUNNING.replace('"0"', '"1"').replace("8.0", "-2")),
     'negative vllm:num_requests_running{engine="1"'),
    (edited(RUNNING, RUNNING.replace("8.0", "1e308") + "\n" + RUNNING.replace('"0"', '"1"').replace("8.0", "1e308")),
     "vllm:num_requests_running adds up to more than a float holds"),
    (VLLM_T0.read_text().replace('le="0.001"', 'le="soon"'), "vllm:time_to_first_token_seconds_bucket has le='soon'"),
    (VLLM_T0.read_text() + "# TYPE batchtop:max_num_seqs gauge\nbatchtop:max_num_seqs 1e300\n",
     "batchtop:max_num_seqs = 1e+300: batchtop serve runs at most 4096"),
]


@pytest.mark.parametrize("text,reason", LIES)
def test_an_exposition_no_server_can_give_is_refused_with_the_series_named(text, reason):
    with pytest.raises(BadExposition) as info:
        parse_exposition(text, 0.0)
    assert reason in str(info.value)


def test_a_lying_replica_is_bad_on_the_panels_and_in_the_json_and_stays_out_of_the_aggregate(tmp_path):
    good, liar = FlakyMetrics(VLLM_T0.read_text()), FlakyMetrics(LIES[0][0])
    out = tmp_path / "attach.json"
    with flaky_server(good) as good_url, flaky_server(liar) as liar_url:
        result = CliRunner().invoke(main, ["attach", good_url, liar_url, "--headless", "--duration", "0.5",
                                           "--interval", "0.5", "--device", "h100", "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    first, second = doc["replicas"]
    assert first["status"] == LIVE and second["status"] == BAD
    assert second["reason"] == 'negative vllm:num_requests_running{engine="0",model_name="tiny-llama"} = -5'
    assert second["health"] == {BAD: doc["ticks"]} and second["running"] is None
    assert doc["aggregate"]["running"] == 8 and 0 <= doc["aggregate"]["kv_usage"] <= 1
    assert f"{liar_url}/metrics: BAD: negative vllm:num_requests_running" in result.output


def replay(tmp_path, ticks: list) -> dict:
    """Record scrapes as an older batchtop did (LIVE, whatever the sample said), replay them headless."""
    path, out = tmp_path / "old.jsonl", tmp_path / "replayed.json"
    rec = AttachRecorder(str(path), attach_header(["http://a:8000/metrics"], 1.0, 30.0, None, None, None))
    for tick, sample in enumerate(ticks, start=1):
        rec.tick(tick, sample.t, [live(sample)])
    rec.close(ticks[-1].t)
    result = CliRunner().invoke(main, ["replay", str(path), "--headless", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())["replicas"][0]


def test_a_replay_judges_recorded_samples_as_the_live_watch_does(tmp_path):
    good = vllm_sample(VLLM_T0, 0.0)
    for change, reason in (({"kv_usage": -50.0}, "negative kv_usage (-50)"),
                           ({"running": -5.0}, "negative running (-5)"),
                           ({"kv_usage": 3.0}, "KV usage 3 outside 0..1"),
                           ({"counters": {**good.counters, "preemptions": -1.0}}, "negative preemptions (-1)")):
        doc = replay(tmp_path, [good, dataclasses.replace(good, t=1.0, **change)])
        assert doc["status"] == BAD and doc["reason"] == reason
        assert doc["kv_usage"] == good.kv_usage and doc["running"] == 8  # the last believable numbers
    ttft = good.histograms["ttft"]
    broken = dataclasses.replace(ttft, counts=tuple(reversed(ttft.counts)))
    doc = replay(tmp_path, [dataclasses.replace(good, histograms={**good.histograms, "ttft": broken})])
    assert doc["status"] == BAD and doc["reason"].startswith("ttft histogram: bucket counts not cumulative")


def test_a_counter_that_drops_in_the_same_process_is_bad_and_a_real_restart_is_a_reset():
    monitor = Monitor(["vllm"])
    monitor.feed([live(vllm_sample(VLLM_T2, 0.0))], 0.0)
    s = monitor.feed([live(vllm_sample(VLLM_T0, 1.0))], 1.0).replicas[0]  # same process_start_time_seconds
    assert s.status == BAD and s.resets == 0 and s.rates == {}
    assert s.reason.startswith("prompt_tokens went backwards (768 -> 384) with no restart")
    s = monitor.feed([live(vllm_sample(VLLM_T2, 3.0))], 3.0).replicas[0]  # the window began again at the drop
    assert s.status == LIVE and s.rates["generation_tokens"] == pytest.approx((12241 - 6497) / 2)

    monitor = Monitor(["vllm"])
    monitor.feed([live(vllm_sample(VLLM_T2, 0.0))], 0.0)
    s = monitor.feed([live(parse_exposition(restarted(VLLM_T0.read_text(), 2e9), 1.0))], 1.0).replicas[0]
    assert s.status == LIVE and s.resets == 1 and s.rates == {}


def test_a_restart_whose_counters_already_passed_the_old_ones_spans_no_rate():
    """A new process start time is a restart even when every counter went up: a rate across it would
    count the old process's tokens against the new one's."""
    monitor = Monitor(["vllm"])
    monitor.feed([live(vllm_sample(VLLM_T0, 0.0))], 0.0)
    s = monitor.feed([live(parse_exposition(restarted(VLLM_T2.read_text(), 2e9), 2.0))], 2.0).replicas[0]
    assert s.status == LIVE and s.resets == 1 and s.rates == {}


async def test_the_replicas_panel_says_which_replica_is_bad_and_why(tmp_path):
    path = str(tmp_path / "liar.jsonl")
    urls = ["http://a:8000/metrics", "http://b:8000/metrics"]
    rec = AttachRecorder(path, attach_header(urls, 1.0, 30.0, None, None, None))
    rec.tick(1, 0.0, [live(vllm_sample(VLLM_T2, 0.0)), live(vllm_sample(VLLM_T0, 0.0))])
    rec.tick(2, 1.0, [live(vllm_sample(VLLM_T0, 1.0)), live(dataclasses.replace(vllm_sample(VLLM_T0, 1.0),
                                                                                kv_usage=-5.0))])
    rec.close(1.0)
    app = BatchtopApp(AttachReplaySource(read_trace(path), speed=64.0))
    async with app.run_test(size=(160, 44)) as pilot:
        await wait_for(pilot, lambda: app.source.frame is not None and app.source.frame.tick == 2)
        await pilot.pause(0.2)
        rows = app.query_one(AttachReplicasPanel).render().plain
        first, second = [line for line in rows.splitlines() if line.startswith((" 0 ", " 1 "))]
        assert " BAD " in first and "prompt_tokens went backwards (768 -> 384) with no restart" in first
        assert " BAD " in second and "negative kv_usage (-5)" in second
        assert app.query_one(AttachReplicasPanel).border_title == "Replicas 0/2 live"
        await pilot.press("q")


def test_counters_growing_faster_than_a_float_holds_are_bad_and_never_reach_the_roofline(tmp_path):
    """Each value finite, their growth per second not: no rate, no point, no panel divides by it."""
    before, after = vllm_sample(VLLM_T0, 0.0), vllm_sample(VLLM_T2, 1e-6)
    scaled = dataclasses.replace(after, counters={**after.counters, "generation_tokens": 1e303})
    monitor = Monitor(["vllm"])
    monitor.feed([live(before)], 0.0)
    s = monitor.feed([live(scaled)], 1e-6).replicas[0]
    assert s.status == BAD and s.reason.startswith("generation_tokens grew by 1e+303 in 1e-06 s")
    assert s.rates == {} and s.point is None
    # a FLOP counter no machine reaches: the point is left out, saying why, rather than drawn off the chart
    flops = dataclasses.replace(vllm_sample(VLLM_T2, 2.0), counters={**after.counters, "flops": 1e40})
    monitor = Monitor(["vllm"])
    monitor.feed([live(vllm_sample(VLLM_T0, 0.0))], 0.0)
    s = monitor.feed([live(flops)], 2.0).replicas[0]
    assert s.status == LIVE and s.point is None and "beyond any real server" in s.point_note


@pytest.mark.parametrize("value,reason", [
    ("1e15", "implausible running 1e+15: no server holds more than 1048576 requests"),
    ("2.5", "implausible running 2.5: requests are counted in whole numbers"),
])
def test_an_impossible_running_count_is_bad_and_left_out_of_the_verdict_which_says_so(tmp_path, value, reason):
    """Before: running 1e15 was LIVE and the verdict said "slots: running at the ceiling of
    1000000000000000"; 2.5 gave "ceiling of 2 ... (mean 2.5)"."""
    out = tmp_path / "attach.json"
    with flaky_server(FlakyMetrics(edited(RUNNING, RUNNING.replace("8.0", value)))) as url:
        result = CliRunner().invoke(main, ["attach", url, "--headless", "--duration", "1.5", "--interval", "0.5",
                                           "--device", "h100", "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    replica, verdict = doc["replicas"][0], doc["verdict"]
    assert replica["status"] == BAD and replica["reason"] == reason and replica["running"] is None
    assert verdict["bound"] == "watching" and "ceiling" not in verdict["line"]
    assert verdict["line"].endswith(f"[left out: {doc['ticks']} scrapes of {url}/metrics, {reason}]")
    assert verdict["evidence"]["implausible_scrapes"]["total"] == doc["ticks"]
    assert f"{url}/metrics: BAD: {reason}" in result.output and "[left out: " in result.output


def test_a_replica_with_impossible_counts_stays_out_of_the_aggregate_and_its_verdict():
    from tests.support.scripted_vllm import ScriptedVllm, Tick
    server, liar = ScriptedVllm(), ScriptedVllm()
    monitor = Monitor(["http://a:8000/metrics", "http://b:8000/metrics"], max_num_seqs=8)
    tick = Tick(4, 28, kv=0.12, steps=(4,) * 40, finished=((64, 256),))
    for i in range(12):
        lie = liar.text(tick).replace('vllm:num_requests_running{engine="0",model_name="scripted"} 4.0',
                                      'vllm:num_requests_running{engine="0",model_name="scripted"} 1e+15')
        frame = monitor.feed([live(parse_exposition(server.text(tick), float(i))),
                              live(parse_exposition(lie, float(i)))], float(i))
    assert frame.replicas[1].status == BAD and frame.replicas[1].reason.startswith("implausible running 1e+15")
    assert frame.aggregate.running == 4 and frame.verdict.evidence["running_max"] == 4
    assert frame.verdict.kind == "unclear" and "1000000000000000" not in frame.verdict.line
    # the verdict reads the last 6 scrapes (5 s); each of them left the liar out
    assert "[left out: 6 scrapes of http://b:8000/metrics, implausible running 1e+15" in frame.verdict.line


def test_fractional_or_absurd_queue_counts_are_implausible_too():
    good = vllm_sample(VLLM_T0, 0.0)
    from batchtop.core_engine.attach.scrape.plausible import sample_problem
    assert sample_problem(good) is None
    assert sample_problem(dataclasses.replace(good, waiting=3.25)) == \
        "implausible waiting 3.25: requests are counted in whole numbers"
    assert sample_problem(dataclasses.replace(good, waiting=2.0 ** 40)) == \
        "implausible waiting 1.09951e+12: no server holds more than 1073741824 requests"
    assert sample_problem(dataclasses.replace(good, waiting_by_reason={"capacity": 0.5})) == \
        "implausible waiting (capacity) 0.5: requests are counted in whole numbers"
