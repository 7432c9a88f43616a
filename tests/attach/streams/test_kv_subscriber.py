"""The KV-event subscriber against publishers run here on loopback: the real capture's frames arrive raw
and in order, a gap is filled through a replay ROUTER speaking vLLM's protocol or said in words when it
cannot be, a restart is counted, and a publisher that never answers hangs nothing."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
import zmq

from batchtop.core_engine.attach.streams.kv_event_frames import KVFrameError, decode_batch
from batchtop.core_engine.attach.streams.kv_subscriber import (END_SEQ, KVEventSubscriber, ReceivedKV,
                                                               default_replay_endpoint, parse_endpoint)
from batchtop.core_engine.attach.streams.kv_endpoints import offset_port
from tests.attach.streams.kv_helpers import TOPIC, capture

HANG_S = 10.0  # a close or a silent peer that takes this long is a hang, whatever the machine's load

WAIT_S = 3.0


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def _bound(ctx: zmq.Context, kind: int) -> tuple[zmq.Socket, str]:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    return sock, f"tcp://127.0.0.1:{port}"


def _silent_listener() -> tuple[socket.socket, str]:
    """A TCP port that accepts connections and never says a word (no ZMTP greeting)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    return listener, f"tcp://127.0.0.1:{listener.getsockname()[1]}"


def _subscribed(pub: zmq.Socket) -> None:
    """Wait for the subscriber's subscription to reach the XPUB, so nothing published is lost to joining."""
    assert pub.poll(int(WAIT_S * 1000)), "the subscriber never subscribed"
    assert pub.recv() == b"\x01" + TOPIC


def _drain(sub: KVEventSubscriber, n: int) -> list[ReceivedKV]:
    out: list[ReceivedKV] = []
    deadline = time.monotonic() + WAIT_S
    while len(out) < n and time.monotonic() < deadline:
        out += sub.drain()
        time.sleep(0.005)
    return out


def _until(predicate) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert predicate()


def _seqs(messages: list[ReceivedKV]) -> list[int]:
    return [int.from_bytes(m.frames[1], "big") for m in messages]


FRAMES = [f for _, f in capture()]


def test_the_captured_messages_arrive_raw_and_in_order(ctx):
    pub, endpoint = _bound(ctx, zmq.XPUB)
    with KVEventSubscriber(endpoint) as sub:
        _subscribed(pub)
        for frames in FRAMES[:10]:
            pub.send_multipart(frames)
        got = _drain(sub, 10)
        assert [m.frames for m in got] == [tuple(f) for f in FRAMES[:10]]
        assert not any(m.replayed for m in got) and all(m.t_unix > 0 for m in got)
        assert [decode_batch(m.frames).seq for m in got] == list(range(10))
        stats = sub.stats()
        assert (stats.received, stats.last_seq, stats.gaps, stats.last_gap) == (10, 9, 0, None)
        assert sub.status_line() == "kv events: 10 batches"


def test_a_gap_is_filled_through_the_replay_router_and_delivered_in_order(ctx):
    pub, endpoint = _bound(ctx, zmq.XPUB)
    router, replay = _bound(ctx, zmq.ROUTER)
    with KVEventSubscriber(endpoint, replay) as sub:
        _subscribed(pub)
        for seq in (0, 1, 2, 7):  # 3-6 lost on the way
            pub.send_multipart(FRAMES[seq])
        assert router.poll(int(WAIT_S * 1000)), "no replay request"
        identity, delimiter, start = router.recv_multipart()
        assert (delimiter, start) == (b"", (3).to_bytes(8, "big"))
        for seq in range(3, 9):  # as vLLM does: everything it holds from `start` on, then the end marker
            router.send_multipart([identity, b"", *FRAMES[seq]])
        router.send_multipart([identity, b"", b"", END_SEQ.to_bytes(8, "big"), b""])
        got = _drain(sub, 8)
        assert _seqs(got) == list(range(8))
        assert [m.replayed for m in got] == [False] * 3 + [True] * 4 + [False]
        assert got[3].frames == tuple(FRAMES[3])
        stats = sub.stats()
        assert (stats.gaps, stats.gaps_filled, stats.gaps_unfilled, stats.replayed, stats.missed) == (1, 1, 0, 4, 0)
        assert stats.last_gap == "seq 3-6 missed, replayed"


def test_a_gap_without_a_replay_endpoint_is_counted_and_said(ctx):
    pub, endpoint = _bound(ctx, zmq.XPUB)
    with KVEventSubscriber(endpoint) as sub:
        _subscribed(pub)
        for seq in (0, 1, 5, 6):
            pub.send_multipart(FRAMES[seq])
        assert _seqs(_drain(sub, 4)) == [0, 1, 5, 6]
        stats = sub.stats()
        assert (stats.gaps_unfilled, stats.missed) == (1, 3)
        assert stats.last_gap == "seq 2-4 missed, no replay endpoint"
        assert sub.status_line() == "kv events: 4 batches, 3 missed (seq 2-4 missed, no replay endpoint)"


def test_a_silent_replay_endpoint_costs_one_timeout_and_is_then_left_alone(ctx):
    pub, endpoint = _bound(ctx, zmq.XPUB)
    listener, replay = _silent_listener()
    try:
        with KVEventSubscriber(endpoint, replay, replay_timeout_s=0.3) as sub:
            _subscribed(pub)
            start = time.monotonic()
            for seq in (0, 3):
                pub.send_multipart(FRAMES[seq])
            assert _seqs(_drain(sub, 2)) == [0, 3]
            assert time.monotonic() - start < HANG_S  # the silent replay endpoint held the stream up, not forever
            assert sub.stats().last_gap == "seq 1-2 missed, replay endpoint silent"
            pub.send_multipart(FRAMES[5])
            assert _seqs(_drain(sub, 1)) == [5]
            listener.setblocking(False)
            asked = 0
            while True:  # each replay request is a fresh connection: the second gap made none
                try:
                    listener.accept()[0].close()
                except BlockingIOError:
                    break
                asked += 1
            assert asked == 1
            stats = sub.stats()
            assert (stats.gaps_unfilled, stats.missed, stats.last_gap) == (2, 3, "seq 4 missed, replay endpoint silent")
            closing = time.monotonic()
        assert time.monotonic() - closing < HANG_S
    finally:
        listener.close()


def test_a_sequence_that_jumps_back_is_a_restart_counted_not_a_gap(ctx):
    pub, endpoint = _bound(ctx, zmq.XPUB)
    with KVEventSubscriber(endpoint) as sub:
        _subscribed(pub)
        for seq in (0, 1, 2, 0, 1):
            pub.send_multipart(FRAMES[seq])
        assert _seqs(_drain(sub, 5)) == [0, 1, 2, 0, 1]
        stats = sub.stats()
        assert (stats.restarts, stats.gaps, stats.last_seq) == (1, 0, 1)
        assert "server restarted 1x" in sub.status_line()


def test_a_publisher_that_never_answers_hangs_nothing():
    listener, endpoint = _silent_listener()
    try:
        sub = KVEventSubscriber(endpoint, default_replay_endpoint(endpoint)).start()
        time.sleep(0.1)  # connected, mid-handshake that never ends
        assert sub.drain() == [] and sub.status_line() == f"kv events: no batch yet from {endpoint}"
        start = time.monotonic()
        sub.close()
        assert time.monotonic() - start < HANG_S
        sub.close()  # twice is harmless
    finally:
        listener.close()
    never_started = KVEventSubscriber("tcp://127.0.0.1:9")
    start = time.monotonic()
    never_started.close()
    assert time.monotonic() - start < HANG_S


def test_a_consumer_that_falls_behind_loses_the_oldest_messages_counted(ctx):
    pub, endpoint = _bound(ctx, zmq.XPUB)
    with KVEventSubscriber(endpoint, max_buffered=5) as sub:
        _subscribed(pub)
        for frames in FRAMES[:12]:
            pub.send_multipart(frames)
        _until(lambda: sub.stats().received == 12)
        assert _seqs(sub.drain()) == list(range(7, 12))
        assert sub.stats().dropped == 7 and "7 dropped (console behind)" in sub.status_line()


def test_a_message_without_a_sequence_number_is_delivered_raw_for_the_decoder_to_reject(ctx):
    pub, endpoint = _bound(ctx, zmq.XPUB)
    with KVEventSubscriber(endpoint) as sub:
        _subscribed(pub)
        pub.send_multipart([TOPIC, b"\x00\x01", b"junk"])
        pub.send_multipart([TOPIC, *([b"x"] * 50)])
        got = _drain(sub, 2)
        assert len(got[1].frames) == 4  # endless frames are not kept
        for message in got:
            with pytest.raises(KVFrameError):
                decode_batch(message.frames)
        assert sub.stats().unsequenced == 2


@pytest.mark.parametrize("text", ["tcp://127.0.0.1:5557", " tcp://vllm-0.example:5557 ", "tcp://[::1]:5557",
                                  "ipc:///tmp/kv-events"])
def test_a_kv_event_endpoint_is_a_tcp_host_and_port_or_an_ipc_path(text):
    assert parse_endpoint(text) == text.strip()


@pytest.mark.parametrize("text, words", [("localhost:5557", "not a KV-event endpoint"),
                                         ("tcp://*:5557", "bind address"), ("tcp://0.0.0.0:5557", "bind address"),
                                         ("tcp://host:0", "port 1-65535"), ("tcp://host:70000", "port 1-65535"),
                                         ("http://host:5557", "tcp://HOST:PORT"), ("ipc://", "needs a path"),
                                         ("tcp://host", "not a KV-event endpoint")])
def test_anything_else_is_a_valueerror_that_shows_the_form(text, words):
    with pytest.raises(ValueError, match=words):
        parse_endpoint(text)
    with pytest.raises(ValueError):
        KVEventSubscriber(text)


def test_the_replay_endpoint_defaults_to_the_next_port_and_ranks_offset_both():
    assert default_replay_endpoint("tcp://10.0.0.7:5557") == "tcp://10.0.0.7:5558"
    assert offset_port("tcp://[::1]:5557", 3) == "tcp://[::1]:5560"
    with pytest.raises(ValueError):
        default_replay_endpoint("ipc:///tmp/kv")
    with pytest.raises(ValueError):
        default_replay_endpoint("tcp://h:65535")


def test_joining_mid_stream_can_catch_up_and_a_replay_buffer_short_of_the_gap_is_said(ctx):
    pub, endpoint = _bound(ctx, zmq.XPUB)
    router, replay = _bound(ctx, zmq.ROUTER)
    with KVEventSubscriber(endpoint, replay, catch_up=True) as sub:
        _subscribed(pub)
        pub.send_multipart(FRAMES[4])  # seqs 0-3 went out before we joined; the buffer still holds 2-3
        assert router.poll(int(WAIT_S * 1000)), "no replay request"
        identity, _, start = router.recv_multipart()
        assert start == (0).to_bytes(8, "big")
        for seq in range(2, 5):
            router.send_multipart([identity, b"", *FRAMES[seq]])
        router.send_multipart([identity, b"", b"", END_SEQ.to_bytes(8, "big"), b""])
        got = _drain(sub, 3)
        assert _seqs(got) == [2, 3, 4] and [m.replayed for m in got] == [True, True, False]
        stats = sub.stats()
        assert (stats.gaps_unfilled, stats.missed, stats.replayed) == (1, 2, 2)
        assert stats.last_gap == "seq 0-3 sent before we joined: 2 of 4 not replayed, not in the replay buffer"
