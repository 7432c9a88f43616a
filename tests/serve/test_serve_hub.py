"""The engine thread and the event loop: no step of added latency, one wake-up per step, no spinning."""

from __future__ import annotations

import asyncio
import time

from batchtop.core_engine.engine import control
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.serve.engine_thread import EngineThread
from batchtop.core_engine.serve.exporter import VllmMetrics
from batchtop.core_engine.serve.hub import RequestHub
from batchtop.core_engine.serve.status_log import StatusLog
from batchtop.core_engine.run.live_session import Session
from tests.conftest import tiny_config


def make_hub() -> tuple[Engine, Session, RequestHub]:
    engine = Engine(tiny_config())
    session = Session(engine, [])
    hub = RequestHub(engine, wake=lambda: None)
    session.listeners.append(hub)
    hub.bind(asyncio.get_running_loop())
    return engine, session, hub


def step(engine: Engine, session: Session) -> None:
    """What the engine thread does: one step, then its listeners."""
    session.after_step(engine.step())


async def test_each_token_reaches_its_stream_before_the_engine_takes_another_step():
    engine, session, hub = make_hub()
    stream = hub.submit(Request("r", (1, 2, 3), 3))
    for n in range(1, 4):
        await asyncio.to_thread(step, engine, session)
        event = await asyncio.wait_for(stream.queue.get(), 5)  # no further step is needed to get it
        assert engine.counters.steps == n and len(event.token_ids) == 1
    assert event.finish_reason == "length" and hub.num_in_flight == 0


async def test_the_engine_thread_wakes_the_loop_once_per_step_however_many_streams_it_feeds(monkeypatch):
    engine, session, hub = make_hub()
    streams = [hub.submit(Request(f"r{i}", (1, 2, 3), 4)) for i in range(4)]
    loop = asyncio.get_running_loop()
    calls = []
    original = loop.call_soon_threadsafe
    monkeypatch.setattr(loop, "call_soon_threadsafe", lambda *a: (calls.append(a), original(*a))[1])
    await asyncio.to_thread(step, engine, session)
    await asyncio.to_thread(step, engine, session)
    assert [fn for fn, *_ in calls if getattr(fn, "__self__", None) is hub] == [hub._deliver] * 2
    for stream in streams:
        assert [len((await stream.queue.get()).token_ids) for _ in range(2)] == [1, 1]


async def test_a_reset_from_the_dashboard_ends_in_flight_streams_with_503_and_metrics_count_on():
    engine, session, hub = make_hub()
    metrics = VllmMetrics(engine.config, "tiny")
    session.listeners.append(metrics)
    stream = hub.submit(Request("r", (1, 2, 3), 30))
    for _ in range(3):
        await asyncio.to_thread(step, engine, session)
        assert (await stream.queue.get()).token_ids
    engine.submit(control.Reset())
    engine.apply_pending()
    session.after_step(engine.snapshot())
    event = await asyncio.wait_for(stream.queue.get(), 5)
    assert event.error.status == 503 and "reset" in event.error.message and hub.num_in_flight == 0
    engine.submit(control.AddRequests((Request("after", (1,), 2),)))
    await asyncio.to_thread(step, engine, session)
    assert metrics.generation_tokens._value.get() == 3 + 1  # never back to 0: a counter only grows


def test_a_closed_event_loop_never_stops_the_engine_thread():
    engine = Engine(tiny_config())
    session = Session(engine, [])
    hub = RequestHub(engine, wake=lambda: None)
    session.listeners.append(hub)
    loop = asyncio.new_event_loop()
    hub.bind(loop)
    stream = loop.run_until_complete(_submit(hub))
    loop.close()  # the server went away first
    step(engine, session)
    session.close("quit")
    assert stream.queue.empty()


async def _submit(hub: RequestHub):
    return hub.submit(Request("r", (1, 2), 5))


class CountingListener:
    def __init__(self) -> None:
        self.snapshots = 0

    def observe(self, snap) -> None:
        self.snapshots += 1

    def closed(self, reason: str, error: str | None) -> None:
        pass


def test_the_engine_loop_sleeps_when_there_is_no_work_and_wakes_for_a_request_or_an_arrival():
    engine = Engine(tiny_config())
    session = Session(engine, [Request("later", (1, 2), 2, arrival_s=0.3)])
    counting = CountingListener()
    session.listeners.append(counting)
    turns = []
    before_step = session.before_step
    session.before_step = lambda: (turns.append(1), before_step())[1]  # one per turn of the loop
    loop = EngineThread(session)
    loop.start()
    try:
        deadline = time.monotonic() + 5
        while engine.counters.completed < 1 and time.monotonic() < deadline:  # the workload's arrival
            time.sleep(0.01)
        assert engine.counters.completed == 1
        seen, turned = counting.snapshots, len(turns)
        time.sleep(0.3)
        assert counting.snapshots == seen and len(turns) <= turned + 1  # idle: asleep, not spinning
        engine.submit(control.AddRequests((Request("now", (3,), 2),)))
        loop.wake()
        while engine.counters.completed < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.counters.completed == 2
    finally:
        loop.stop()
    assert loop.done.is_set() and loop.error is None


async def test_the_headless_summary_line_says_what_ran_and_stays_quiet_when_nothing_did():
    engine, session, hub = make_hub()
    log = StatusLog(engine, hub, write=lambda line: None)
    assert log.line() is None  # no step yet
    hub.submit(Request("r", (1, 2, 3), 40))
    for _ in range(3):
        await asyncio.to_thread(step, engine, session)
    line = log.line()
    assert line.startswith("running 1 · waiting 0 · KV ") and "in flight 1" in line
    assert line.endswith("continuous, max_num_seqs 4")
    assert "generation" in line and "completed 0 (+0)" in line
    engine.submit(control.Abort("r"))
    await asyncio.to_thread(step, engine, session)
    log.line()
    assert log.line() is None  # idle since the last line: nothing to say
