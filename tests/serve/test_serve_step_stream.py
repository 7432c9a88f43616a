"""`batchtop serve`'s step stream (GET /batchtop/steps): the trace's own header + step events, one encoding
fanned out to every viewer, bounded per viewer, behind the API key, ending when the server does."""

from __future__ import annotations

import threading

import httpx
import pytest

from batchtop.core_engine.attach.engine_stream import EngineStream, StreamItem, StreamRefused
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.run.live_session import Session
from batchtop.core_engine.serve.step_stream import StepPublisher
from batchtop.core_engine.trace.trace import read_trace
from tests.conftest import make_requests, tiny_config
from tests.support.local_http import Answering, local_server
from tests.support.serving import serving

HEADER = {"config": tiny_config().as_dict(), "device": {"kind": "cpu", "name": "test-cpu"}, "peaks": None}


def read_all(stream: EngineStream, into: list[StreamItem]) -> threading.Thread:
    thread = threading.Thread(target=lambda: into.extend(stream.items()), daemon=True)
    thread.start()
    return thread


def steps_of(items: list[StreamItem]) -> list[int]:
    return [i.snapshot.counters.steps for i in items if i.snapshot is not None and i.snapshot.is_step]


def published(max_num_seqs: int, requests: int, seed: int, prompt: tuple[int, int], output: tuple[int, int],
              **publisher: int) -> tuple[Engine, Session, StepPublisher]:
    """An engine stepped by hand (no server), its session publishing each step."""
    engine = Engine(tiny_config(max_num_seqs=max_num_seqs, num_kv_blocks=64))
    session = Session(engine, make_requests(requests, seed=seed, prompt=prompt, output=output))
    engine.load_workload(session.workload)
    steps = StepPublisher(HEADER, initial=engine.snapshot(), **publisher)
    session.listeners.append(steps)
    return engine, session, steps


def test_two_viewers_see_the_same_steps_and_the_stream_ends_when_the_server_stops():
    with serving() as server:
        viewers = [EngineStream(server.url) for _ in range(2)]
        headers = [v.open() for v in viewers]  # subscribed: every step from here on reaches both
        assert all(h["format"] == "batchtop.trace" and h["config"]["max_num_seqs"] == 16 for h in headers)
        seen: list[list[StreamItem]] = [[], []]
        threads = [read_all(v, into) for v, into in zip(viewers, seen)]
        for _ in range(3):
            assert server.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 5}).status_code == 200
        served_steps = server.engine.counters.steps
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    a, b = (steps_of(items) for items in seen)
    assert a == b and a[-1] == served_steps and len(a) >= 5
    assert [items[-1].end for items in seen] == ["the server shut down"] * 2
    assert all(v.num_bad_lines == 0 for v in viewers)


def test_a_viewer_that_never_reads_drops_steps_counted_and_resyncs_to_the_engines_state(tmp_path):
    engine, session, publisher = published(4, 12, 1, (3, 9), (4, 20), max_steps=3)
    slow = publisher.subscribe()
    for _ in range(25):
        session.step()
    assert len(slow.lines) == 3 and slow.dropped == 25 - 1  # header + keyframe + one step, never more
    lines = [*slow.lines]
    slow.lines.clear()
    for _ in range(3):  # room again: a keyframe of the step, then its deltas
        session.step()
    lines += [*slow.lines]
    path = tmp_path / "viewer.trace"
    path.write_bytes(b"".join(lines))
    snaps = [snap for _, snap in read_trace(str(path)).snapshots() if snap is not None]  # a stream is a trace
    last, latest = snaps[-1], engine.latest
    assert last.counters == latest.counters and last.block_owners == latest.block_owners
    assert [(s.index, s.phase) for s in last.slots] == [(s.index, s.phase) for s in latest.slots]
    assert [w.index for w in last.waiting] == [w.index for w in latest.waiting]


def test_a_viewer_joining_mid_run_gets_the_header_and_the_latest_state_at_once():
    engine, session, publisher = published(2, 6, 3, (3, 9), (8, 20))
    for _ in range(6):
        session.step()  # nobody watches: nothing is encoded
    late = publisher.subscribe()
    assert len(late.lines) == 2  # the header, the keyframe
    assert b'"stream_sync"' in late.lines[1] and b'"kv":' in late.lines[1]


def test_the_stream_is_behind_the_api_key_like_v1_and_metrics_stays_open():
    with serving(api_key="s3cret") as server:
        assert server.get("/batchtop/steps").status_code == 401
        assert server.get("/metrics").status_code == 200
        with pytest.raises(StreamRefused, match="API key") as refused:
            EngineStream(server.url).open()
        assert refused.value.status == 401
        keyed = EngineStream(server.url, api_key="s3cret")
        assert keyed.open()["format"] == "batchtop.trace"
        keyed.close()


def test_server_sent_events_carry_the_same_lines_for_a_browser():
    with serving() as server:
        with httpx.stream("GET", server.url + "/batchtop/steps", headers={"Accept": "text/event-stream"},
                          timeout=10) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            first = next(line for line in response.iter_lines() if line)
        assert first.startswith('data: {"seq":0') and '"format":"batchtop.trace"' in first


def test_bad_and_hostile_lines_are_counted_and_skipped():
    engine, session, publisher = published(2, 3, 5, (3, 6), (3, 6))
    sub = publisher.subscribe()
    for _ in range(3):
        session.step()
    good = b"".join(sub.lines).splitlines(keepends=True)
    junk = [b"not json\n", b"[1, 2]\n", b'{"seq": 900, "t": 1, "type": "step", "slots": "x"}\n',
            b'{"seq": 901, "t": 1, "type": "step", "step": 9}\n', b"\xff\xfe\n"]
    body = b"".join(good[:2] + junk + good[2:]) + b'{"seq":999,"t":2,"type":"end","reason":"bye"}\n'

    class Hostile(Answering):
        def do_GET(self) -> None:
            self.answer(200, body, "application/x-ndjson")

    with local_server(Hostile) as url:
        stream = EngineStream(url)
        stream.open()
        items = list(stream.items())
    assert stream.num_bad_lines == len(junk)
    assert items[-1].end == "bye" and steps_of(items)[-1] == engine.counters.steps
