"""The client-barrier reading from synthetic metric series (vLLM's names, consistent counts: what runs
plus what finished is what arrived): a client that sends batches and waits for each whole one is
"client (batches)" however long its batches take; a client that keeps requests in flight, a steady
trickle and random arrivals are not."""

from __future__ import annotations

import math
import random

import pytest

from batchtop.core_engine.attach.verdict.bursts import BurstWatch
from batchtop.core_engine.attach.history import HistoryPoint
from tests.support.scripted_vllm import Tick, feed

# a batch of 16 answers: most short, one long (the straggler every batch waits for), in scrapes
LENGTHS = (2, 2, 3, 3, 3, 4, 4, 5, 5, 6, 7, 8, 10, 12, 16, 24)


def tick(running: int, finished: int, waiting: int = 0) -> Tick:
    return Tick(running, waiting, kv=0.1, steps=(max(running, 1),) * 4, finished=((40, 60),) * finished)


def batches(n: int, lengths=LENGTHS, scale: int = 1, idle: int = 3) -> list[Tick]:
    """A client that sends len(lengths) requests at once and the next batch only when all have finished."""
    ticks = [tick(0, 0)] * idle
    ends = [length * scale for length in lengths]
    for _ in range(n):
        for k in range(1, max(ends) + 1):
            ticks.append(tick(sum(e > k for e in ends) if k < max(ends) else 0, sum(e == k for e in ends)))
    return ticks


def in_flight(concurrency: int, total: int, seed: int = 0) -> list[Tick]:
    """A client that keeps `concurrency` requests in flight, a new one as each finishes."""
    rng, ticks, sent, running = random.Random(seed), [tick(0, 0)] * 3, 0, 0
    ends: list[int] = []
    for k in range(1, 10_000):
        done = sum(e == k for e in ends)
        ends = [e for e in ends if e > k]
        while len(ends) < concurrency and sent < total:
            ends.append(k + rng.choice(LENGTHS))
            sent += 1
        running = len(ends)
        ticks.append(tick(running, done))
        if not ends and sent >= total:
            return ticks + [tick(0, 0)] * 2
    raise AssertionError("never finished")


def test_batches_of_16_that_drain_before_the_next_are_client_batches_with_the_evidence():
    frames = feed(batches(3), max_num_seqs=16)
    v = frames[-2].verdict  # the third batch's straggler still runs
    assert v.kind == "client" and v.evidence["pattern"] == "barrier"
    assert v.evidence["bursts"] == 3 and v.evidence["burst_size"] == 16 and v.evidence["period_s"] == 24
    assert v.evidence["drained_to"] == 0
    assert "client (batches): 3 bursts of ~16 of 16 slots that drain before the next (to 0 running, one " \
           "every 24 s): the client waits for each batch" in v.line
    assert "examples/in_flight_client.py" in v.advice and "static batching by accident" in v.advice
    # from the third burst on, not before: one batch after another once is no pattern yet
    third = 3 + 2 * 24  # the tick the third batch arrives
    assert all(f.verdict.evidence.get("pattern") != "barrier" for f in frames[:third])
    later = [f.verdict for f in frames[third:]]
    assert later and all(v.kind == "client" and v.evidence["pattern"] == "barrier" for v in later)


def test_batches_longer_than_the_last_minute_are_still_batches():
    """On a CPU server a batch of 16 with one long answer takes minutes: before, the refills were
    counted over the last minute only, and attach said "client (low load)" throughout."""
    frames = feed(batches(3, scale=4), max_num_seqs=16)  # 96 s a batch
    v = frames[-2].verdict
    assert v.kind == "client" and v.evidence["pattern"] == "barrier", v.line
    assert v.evidence["bursts"] == 3 and v.evidence["period_s"] == 96
    assert "3 bursts of ~16 of 16 slots" in v.line and "low load" not in v.line


def test_a_client_that_keeps_requests_in_flight_is_never_batches_even_run_twice():
    """Its count stays flat (each finish replaced at once) and drains at the end, like a batch: the
    arrivals it makes while the others run are what tells it apart."""
    frames = feed(in_flight(16, 80) + in_flight(16, 80, seed=1), max_num_seqs=32)
    kinds = {(f.verdict.kind, f.verdict.evidence.get("pattern")) for f in frames}
    assert ("client", "low rate") in kinds and all(p != "barrier" for _, p in kinds)


def test_a_steady_trickle_of_one_or_two_is_low_load():
    ticks = [tick(0, 0)] * 3 + [tick(r, 1) for r in (1, 2, 2, 1, 2, 1, 1, 2) * 6]
    v = feed(ticks, max_num_seqs=16)[-1].verdict
    assert v.kind == "client" and v.evidence["pattern"] == "low rate" and "client (low load)" in v.line


def poisson(rng: random.Random, mean: float) -> int:
    k, p, floor = 0, rng.random(), math.exp(-mean)
    while p > floor:
        k, p = k + 1, p * rng.random()
    return k


@pytest.mark.parametrize("rate,finish", [(0.5, 0.3), (2.0, 0.3), (4.0, 0.5), (1.0, 0.1)])
def test_random_arrivals_are_not_batches(rate, finish):
    """Requests at random (Poisson, `rate` a scrape), each finishing with chance `finish` a scrape."""
    for seed in range(2):
        rng, ticks, running = random.Random(seed), [tick(0, 0)] * 3, 0
        for _ in range(200):
            done = sum(rng.random() < finish for _ in range(running))
            running += poisson(rng, rate) - done
            ticks.append(tick(running, done))
        frames = feed(ticks, max_num_seqs=64)
        assert all(f.verdict.evidence.get("pattern") != "barrier" for f in frames)


def test_a_trickle_after_the_batches_ends_the_batches_reading():
    ticks = batches(3) + [tick(r, 1) for r in (1, 2, 1, 2, 2, 1, 1, 2, 1, 2)]
    frames = feed(ticks, max_num_seqs=16)
    assert frames[-12].verdict.evidence.get("pattern") == "barrier"
    assert frames[-1].verdict.kind == "client" and frames[-1].verdict.evidence["pattern"] == "low rate"


def point(t: float, running: float, finished: float | None, waiting: float = 0.0) -> HistoryPoint:
    return HistoryPoint(t, running, waiting, None, None, dt=1.0, finished=finished)


def test_a_burst_admitted_over_two_scrapes_and_a_server_without_finish_counts():
    """A batch that waits a step to be admitted (9 running, 7 waiting) is one burst of 16, and one that
    straddles a scrape (3, then 16) is one too; where the server does not count finished requests,
    only a rise in flight is an arrival."""
    watch = BurstWatch()
    series = [(0, 0), (9, 7), (13, 0), (9, 0), (5, 0), (2, 0), (0, 0), (3, 0), (16, 0), (12, 0), (8, 0), (3, 0),
              (1, 0), (12, 0), (5, 0)]
    for t, (running, waiting) in enumerate(series):
        watch.see(point(float(t), running, None, waiting))
    reading = watch.reading()
    assert [b.size for b in watch.bursts] == [16, 16, 11] and [b.start_t for b in watch.bursts] == [1, 7, 13]
    assert reading is not None and reading.bursts == 3 and reading.period_s == 6 and reading.drained_to == 1


def verdicts_of(name: str) -> list[tuple[float, object]]:
    from batchtop.core_engine.attach.record.record import monitor_for, recorded_ticks
    from batchtop.core_engine.trace.trace import read_trace
    from tests.support.attach_helpers import DATA
    trace = read_trace(str(DATA / name))
    monitor = monitor_for(trace)
    return [(t, monitor.feed(results, t).verdict) for t, results in recorded_ticks(trace)]


def test_real_batchtop_serve_on_a_busy_cpu_under_the_batch_client_reads_batches_from_the_third():
    """batchtop serve (SmolLM2, 16 slots, a 2-core CPU at load 7) under examples/batch_client.py
    --requests 48: three batches of 16 over 270 s, each admitted over several scrapes (its gauges move
    once per engine step, seconds apart). Before: "client (low load)" throughout."""
    verdicts = verdicts_of("attach-batchtop-serve-smollm2-cpu-batch-client.jsonl.gz")
    batches = [t for t, v in verdicts if v.evidence.get("pattern") == "barrier"]
    assert batches and batches[0] == pytest.approx(195, abs=1) and batches[-1] == verdicts[-1][0]
    assert all(v.kind == "client" and v.evidence.get("pattern") == "barrier" for t, v in verdicts if t >= 195)
    last = verdicts[-1][1]
    assert (last.evidence["bursts"], last.evidence["burst_size"], last.evidence["drained_to"]) == (3, 16, 0)
    assert "3 bursts of ~16 of 16 slots that drain before the next (to 0 running, one every 90 s)" in last.line


def test_real_batchtop_serve_under_the_in_flight_client_never_reads_batches():
    """The same server and requests, kept 16 in flight: 47 s instead of 276 s, and no batches."""
    verdicts = verdicts_of("attach-batchtop-serve-smollm2-cpu-in-flight-client.jsonl.gz")
    assert verdicts and all(v.evidence.get("pattern") != "barrier" for _, v in verdicts)


def watched(name: str):
    from batchtop.core_engine.trace.trace import read_trace
    from batchtop.tui.cli.attach_replay import replayed
    from tests.support.attach_helpers import DATA
    return replayed(read_trace(str(DATA / name)))


def test_two_batches_then_idle_read_as_batches_over_the_whole_watch():
    """batchtop serve (SmolLM2, 16 slots) under examples/batch_client.py --requests 32: two batches of 16,
    then 25 s idle. No tick reads batches (two are no pattern while the watch goes on) and the watch ends
    idle; the verdict over the whole watch names the batches, on stderr and in the JSON."""
    from batchtop.core_engine.attach.report import attach_report
    from batchtop.tui.cli.attach import verdict_lines
    monitor, frame = watched("attach-batchtop-serve-smollm2-cpu-2-batches.jsonl.gz")
    assert frame.verdict.kind == "idle"
    assert all(s.kind != "client" or "batches" not in s.line for s in monitor.tracker.stretches)
    lines = verdict_lines(monitor, frame)
    assert lines[1].startswith("over the whole watch: client (batches): 2 bursts of ~16 of 16 slots")
    assert "examples/in_flight_client.py" in lines[1]
    doc = attach_report(monitor, frame, interval_s=1.0, peaks=None, peaks_note="recorded", complete=True)
    assert doc["watch_verdict"]["bound"] == "client" and doc["watch_verdict"]["evidence"]["bursts"] == 2


def test_over_the_whole_watch_is_silent_where_the_ticks_said_it_or_there_were_no_batches():
    for name in ("attach-batchtop-serve-smollm2-cpu-batch-client.jsonl.gz",  # three batches: the ticks said it
                 "attach-batchtop-serve-smollm2-cpu-in-flight-client.jsonl.gz"):  # kept in flight: no batches
        monitor, frame = watched(name)
        assert monitor.tracker.over_watch(frame.history) is None
    from batchtop.core_engine.attach.monitor import Monitor
    from batchtop.core_engine.attach.scrape.sample import parse_exposition
    from tests.support.attach_helpers import live
    from tests.support.scripted_vllm import ScriptedVllm
    server, monitor = ScriptedVllm(), Monitor(["http://scripted:8000/metrics"], max_num_seqs=32)
    for i, t in enumerate(in_flight(16, 80) + [tick(0, 0)] * 10 + in_flight(16, 80, seed=1) + [tick(0, 0)] * 10):
        frame = monitor.feed([live(parse_exposition(server.text(t), float(i)))], float(i))
    # two runs that each drained at their end, as batches do, but kept 16 in flight while they ran
    assert monitor.tracker.bursts.reading(watch_ended=True) is None
    assert monitor.tracker.over_watch(frame.history) is None
