"""The verdict: what bounds the batch, from scripted vLLM expositions (prometheus_client under vLLM's
names and buckets) and from the real vLLM recording. Each verdict and its evidence are what the
signals say, and one noisy scrape never flips it."""

from __future__ import annotations

import itertools
import json

import pytest
from click.testing import CliRunner

from batchtop.core_engine.attach.record.record import monitor_for, recorded_ticks
from batchtop.core_engine.attach.verdict.verdict_tracker import CONFIRM
from batchtop.core_engine.trace.trace import read_trace
from batchtop.tui.cli import main
from tests.support.attach_helpers import DATA
from tests.support.scripted_vllm import Tick, feed, scripted_server

N = 20


def slot_bound(n: int = N) -> list[Tick]:
    return [Tick(4, 28, kv=0.12, steps=(4,) * 40, finished=((64, 256),)) for _ in range(n)]


def low_load(n: int = N) -> list[Tick]:
    return [Tick(r, 0, kv=0.03, steps=(r,) * 50, finished=((50, 100),)) for r in itertools.islice(
        itertools.cycle((2, 2, 1)), n)]


def test_slots_bound_with_the_ceiling_given():
    v = feed(slot_bound(), max_num_seqs=4)[-1].verdict
    assert v.kind == "slots"
    ev = v.evidence
    assert (ev["ceiling"], ev["ceiling_source"], ev["at_ceiling_share"]) == (4, "--max-num-seqs", 1.0)
    assert ev["waiting_mean"] == 28 and ev["waiting_by_reason"] == {"capacity": 28, "deferred": 0}
    assert ev["kv_mean"] == pytest.approx(0.12)
    assert "ceiling of 4 (from --max-num-seqs) in 100% of" in v.line and "KV 12%" in v.line
    assert v.advice.startswith("try: raise --max-num-seqs above 4: KV has room (12%)")


def test_slots_bound_with_the_ceiling_inferred_from_the_plateau_and_labelled_so():
    frames = feed(slot_bound())
    v = frames[-1].verdict
    assert v.kind == "slots" and v.evidence["ceiling"] == 4 and v.evidence["ceiling_source"] == "inferred"
    assert "4, inferred from the plateau (vLLM does not export max_num_seqs)" in v.line
    assert frames[-1].main.max_num_seqs is None  # the inference is the verdict's, not a measured ceiling


def test_kv_bound_with_preemptions_and_their_recompute_cost():
    ticks = [Tick(12, 6, kv=0.97, steps=(12,) * 28 + (112,) * 2, finished=((100, 200),) * 2, preemptions=1)] * N
    v = feed(ticks, max_num_seqs=64)[-1].verdict
    assert v.kind == "kv"
    assert v.evidence["preemptions_per_s"] == pytest.approx(1.0)
    # per tick: 2 x 100 prompt and 360 generated tokens, 2 finished -> (200 + 360 / 2) / 2 = 190 a request
    assert v.evidence["recompute_tok_s"] == pytest.approx(190.0)
    assert "KV cache: 97% full (peak 97%), 6 waiting" in v.line and "1.00 preemptions/s ≈ 190 tok/s recomputed" in v.line
    assert "--kv-cache-dtype fp8" in v.advice


def test_kv_full_without_preemptions_is_kv_bound_too():
    ticks = [Tick(9, 7, kv=0.95, steps=(9,) * 30) for _ in range(N)]
    assert feed(ticks, max_num_seqs=256)[-1].verdict.kind == "kv"


def test_budget_bound_when_the_steps_pile_in_their_top_bucket_while_prompts_wait():
    ticks = [Tick(r, 12, kv=0.3, steps=(2048,) * 8) for r in itertools.islice(itertools.cycle((5, 6, 7, 6)), N)]
    v = feed(ticks)[-1].verdict
    assert v.kind == "budget"
    assert v.evidence["step_bucket"] == [1024.0, 2048.0] and v.evidence["step_bucket_share"] == 1.0
    assert f"100% of {8 * v.evidence['scrapes']} steps hold 1024-2048 tokens (the top bucket: the budget, inferred)" \
        in v.line
    assert "--max-num-batched-tokens" in v.advice


def test_decode_steps_in_one_bucket_are_not_a_budget():
    """Steps of one token per running request pile in one bucket too; that is no budget."""
    ticks = [Tick(r, 12, kv=0.3, steps=(r,) * 30) for r in itertools.islice(itertools.cycle((5, 6, 7, 6)), N)]
    assert feed(ticks)[-1].verdict.kind == "unclear"


def test_client_bound_by_a_low_load():
    v = feed(low_load(), max_num_seqs=32)[-1].verdict
    assert v.kind == "client" and v.evidence["pattern"] == "low rate"
    assert v.evidence["waiting_share"] == 0 and v.evidence["finished_per_s"] == pytest.approx(1.0)
    assert "client (low load): nothing waits; 1.7 running on average (peak 2) of 32 slots" in v.line
    assert v.advice.startswith("try: send more requests at once")


def test_client_bound_by_barriers_drains_and_refills():
    """Batches of 16: each arrives at once and finishes over 7 scrapes; the next goes out as the last
    answer comes (the client waits for each batch)."""
    cycle = ((16, 0), (16, 0), (12, 4), (8, 4), (4, 4), (1, 3), (0, 1))
    ticks = [Tick(r, 0, kv=0.2, steps=(r,) * 20 if r else (), finished=((60, 120),) * done)
             for r, done in cycle * 3]
    v = feed(ticks, max_num_seqs=16)[-2].verdict
    assert v.kind == "client" and v.evidence["pattern"] == "barrier"
    assert v.evidence["bursts"] == 3 and v.evidence["burst_size"] == 16 and v.evidence["drained_to"] == 0
    assert "3 bursts of ~16 of 16 slots that drain before the next (to 0 running, one every 7.0 s)" in v.line
    # the completions come as the batch drains: 5 of the 7 scrapes of a cycle, so the busiest quarter of
    # the last 20 scrapes (5) holds 16 of their 47, against a quarter for a steady stream
    assert v.evidence["completions_in_busiest_quarter"] == pytest.approx(16 / 47)
    assert "examples/in_flight_client.py" in v.advice and "static batching by accident" in v.advice


def test_deferred_requests_are_named_as_such():
    ticks = [Tick(3, 5, kv=0.2, deferred=5, steps=(3,) * 20) for _ in range(N)]
    v = feed(ticks, max_num_seqs=8)[-1].verdict
    assert v.kind == "deferred" and v.evidence["waiting_by_reason"]["deferred"] == 5
    assert "--max-loras" in v.advice


def test_an_idle_server():
    v = feed([Tick(0, 0, kv=0.0)] * 10)[-1].verdict
    assert v.kind == "idle" and "no token in the last" in v.line


def test_the_first_verdict_waits_for_scrapes_that_agree():
    frames = feed(slot_bound(8), max_num_seqs=4)
    kinds = [f.verdict.kind for f in frames]
    first = kinds.index("slots")
    assert set(kinds[:first]) == {"watching"} and first >= CONFIRM
    assert "the scrapes point to SLOTS" in frames[first - 1].verdict.line


def test_one_noisy_scrape_never_flips_the_verdict():
    ticks = slot_bound(30)
    for i in (14, 22):  # an empty queue and a KV spike for one scrape each
        ticks[i] = Tick(0, 0, kv=0.99)
    kinds = [f.verdict.kind for f in feed(ticks, max_num_seqs=4)]
    assert set(kinds[CONFIRM + 2:]) == {"slots"}


def test_a_real_change_takes_over_after_confirm_ticks_and_is_flagged_meanwhile():
    frames = feed(slot_bound(12) + low_load(30), max_num_seqs=32)
    kinds = [f.verdict.kind for f in frames]
    switched = kinds.index("client")
    assert kinds[switched - 1] != "client" and all(k == "client" for k in kinds[switched:])
    pending = [f.verdict for f in frames[12:switched] if f.verdict.candidate == "client"]
    assert len(pending) == CONFIRM - 1  # seen, not yet believed


def test_the_real_vllm_recording_is_slot_bound_at_its_ceiling():
    trace = read_trace(str(DATA / "attach-vllm-0.32-cpu.jsonl.gz"))
    monitor = monitor_for(trace)
    kinds = [monitor.feed(results, t).verdict for t, results in recorded_ticks(trace)]
    assert kinds[5].kind == "idle"  # before the bench client starts, at 6 s
    busy = [v for v in kinds[15:45]]
    assert {v.kind for v in busy} == {"slots"}
    assert all(v.evidence["ceiling"] == 16 and v.evidence["ceiling_source"] == "--max-num-seqs" for v in busy)


def test_the_headless_json_carries_the_verdict_and_its_evidence(tmp_path):
    out = tmp_path / "attach.json"
    with scripted_server(slot_bound(200)) as url:
        result = CliRunner().invoke(main, ["attach", url, "--headless", "--duration", "2", "--interval", "0.1",
                                           "--device", "h100", "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    verdict = doc["verdict"]
    assert verdict["bound"] == "slots" and verdict["evidence"]["ceiling"] == 4
    assert verdict["evidence"]["ceiling_source"] == "inferred" and verdict["try"].startswith("try: raise --max-num-seqs")
    assert "verdict: slots: running at the ceiling of 4, inferred" in result.output


def verdicts_of(name: str) -> list[tuple[float, object]]:
    trace = read_trace(str(DATA / name))
    monitor = monitor_for(trace)
    return [(t, monitor.feed(results, t).verdict) for t, results in recorded_ticks(trace)]


def test_real_vllm_with_4_slots_under_32_clients_is_slot_bound_at_an_inferred_4():
    """vLLM 0.32 CPU, --max-num-seqs 4, vLLM's bench client at --max-concurrency 32 from t=18 s."""
    verdicts = verdicts_of("attach-vllm-0.32-cpu-4slots-32clients.jsonl.gz")
    kinds = [k for k, _ in itertools.groupby(v.kind for _, v in verdicts)]
    assert kinds == ["watching", "idle", "slots"]  # no transient verdict from the idle scrapes before the load
    during = [v for t, v in verdicts if 25 <= t <= 45]
    assert {v.kind for v in during} == {"slots"}
    assert all((v.evidence["ceiling"], v.evidence["ceiling_source"]) == (4, "inferred") for v in during)
    assert all(v.evidence["waiting_mean"] >= 4 and v.evidence["kv_mean"] < 0.01 for v in during)


def test_real_vllm_with_32_slots_under_2_clients_is_client_bound_by_a_low_load():
    """vLLM 0.32 CPU, --max-num-seqs 32, vLLM's bench client at --max-concurrency 2 from t=13 s."""
    verdicts = verdicts_of("attach-vllm-0.32-cpu-32slots-2clients.jsonl.gz")
    during = [v for t, v in verdicts if 18 <= t <= 34]
    assert {v.kind for v in during} == {"client"} and {v.evidence["pattern"] for v in during} == {"low rate"}
    assert all(v.evidence["running_max"] == 2 and v.evidence["waiting_share"] == 0 for v in during)
    # while the load arrives (t = 13-16 s) the idle verdict holds, with the words it had: never
    # "nothing running" over scrapes in which 2 run
    idle_lines = {v.line for _, v in verdicts if v.kind == "idle"}
    assert len(idle_lines) <= 2 and all("in the last 5 s" in line or "in the last 6 s" in line for line in idle_lines)


def test_the_ceiling_inferred_stays_while_the_queue_drains():
    frames = feed(slot_bound(12) + [Tick(4, 0, kv=0.12, steps=(4,) * 40)] * 3)
    v = frames[-1].verdict
    assert v.evidence["ceiling"] == 4 and v.evidence["ceiling_source"] == "inferred" and "None" not in v.line + v.advice


def test_a_server_that_stops_answering_keeps_its_last_verdict():
    from batchtop.core_engine.attach.monitor import Monitor
    from batchtop.core_engine.attach.scrape.sample import parse_exposition
    from batchtop.core_engine.attach.scrape.scrape import DOWN, ScrapeResult
    from tests.support.attach_helpers import live
    from tests.support.scripted_vllm import ScriptedVllm
    server, monitor = ScriptedVllm(), Monitor(["a"], max_num_seqs=4)
    for i, tick in enumerate(slot_bound(10)):
        last = monitor.feed([live(parse_exposition(server.text(tick), float(i)))], float(i)).verdict
    down = [monitor.feed([ScrapeResult(DOWN, "refused", None, 0.0)], 10.0 + i).verdict for i in range(6)]
    assert last.kind == "slots" and all(v == last for v in down)


def test_batchtop_serve_says_its_own_ceiling_and_budget_and_the_verdict_uses_them():
    """batchtop serve's `batchtop:max_num_seqs` is the ceiling, over a --max-num-seqs that disagrees."""
    from batchtop.core_engine.attach.monitor import Monitor
    from batchtop.core_engine.attach.scrape.sample import parse_exposition
    from tests.support.attach_helpers import live
    from tests.support.scripted_vllm import ScriptedVllm
    knobs = ("# TYPE batchtop:max_num_seqs gauge\nbatchtop:max_num_seqs 4\n"
             "# TYPE batchtop:max_num_batched_tokens gauge\nbatchtop:max_num_batched_tokens 2048\n")
    server, monitor = ScriptedVllm(), Monitor(["a"], max_num_seqs=8)
    for i, tick in enumerate(slot_bound(10)):
        frame = monitor.feed([live(parse_exposition(server.text(tick) + knobs, float(i)))], float(i))
    v = frame.verdict
    assert frame.main.flavour == "batchtop" and v.kind == "slots"
    assert (v.evidence["ceiling"], v.evidence["ceiling_source"], v.evidence["token_budget"]) == \
        (4, "batchtop:max_num_seqs", 2048)
    assert "ceiling of 4 (batchtop:max_num_seqs) in 100% of" in v.line and "above 4" in v.advice
