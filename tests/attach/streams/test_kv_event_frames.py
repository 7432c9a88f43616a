"""KV-event messages decode from the real vLLM 0.32 capture and from 0.22's positional arrays, and
hostile messages cost bounded work and one KVFrameError each."""

from __future__ import annotations

import os
import tracemalloc

import msgpack
import pytest

from batchtop.core_engine.attach.streams.kv_event_frames import (MAX_EVENTS, MAX_TOKEN_IDS, AllBlocksCleared,
                                                                 BlockRemoved, BlockStored, KVFrameError,
                                                                 decode_batch)
from tests.attach.streams.kv_helpers import TOPIC, array_encoded, capture, frames, raw_payloads, seq_frame


def test_every_captured_message_decodes_to_the_events_msgpack_reads_in_it():
    messages, payloads = capture(), raw_payloads()
    assert len(messages) == 86
    for i, ((_, f), payload) in enumerate(zip(messages, payloads)):
        batch = decode_batch(f)
        assert (batch.seq, batch.ts, batch.dp_rank) == (i, payload[0], payload[2])
        assert (batch.num_unknown, batch.num_left_out) == (0, 0)
        assert [type(e).__name__ for e in batch.events] == [e["type"] for e in payload[1]]
        for event, raw in zip(batch.events, payload[1]):
            assert event.block_hashes == tuple(raw["block_hashes"])
            assert event.medium == raw["medium"] == "GPU"
            if isinstance(event, BlockStored):
                assert event.parent_block_hash == raw["parent_block_hash"]
                assert event.token_ids == tuple(raw["token_ids"])
                assert len(event.token_ids) == event.block_size * len(event.block_hashes)
                assert event.block_size == 32
    first = decode_batch(messages[0][1]).events[0]
    assert first.parent_block_hash is None and len(first.block_hashes) == 11  # a whole system prompt


def test_positional_arrays_of_0_22_decode_to_the_same_events():
    for (_, mapped), arrays in zip(capture(), array_encoded()):
        a, b = decode_batch(mapped), decode_batch(arrays)
        assert a.events == b.events and a.seq == b.seq and a.ts == b.ts
        assert b.dp_rank is None  # 0.22 did not send it
    older = frames(3, [1.5, [["BlockStored", [7, 8], None, list(range(32)), 16, None], ["BlockRemoved", [7]],
                             ["AllBlocksCleared"]], 2])  # 0.9: no medium yet
    assert decode_batch(older).events == (BlockStored((7, 8), None, tuple(range(32)), 16),
                                          BlockRemoved((7,)), AllBlocksCleared())
    assert decode_batch(older).dp_rank == 2


def test_bytes_hashes_and_unknown_event_types_are_kept_and_counted():
    h = bytes(range(32))
    batch = decode_batch(frames(0, [0.0, [{"type": "BlockStored", "block_hashes": [h], "parent_block_hash": None,
                                           "token_ids": [1, 2], "block_size": 2},
                                          {"type": "BlockPinned", "block_hashes": [h]}, ["SomethingNew", 1]]]))
    assert batch.events == (BlockStored((h,), None, (1, 2), 2),)
    assert batch.num_unknown == 2


@pytest.mark.parametrize("bad, reason", [
    ([TOPIC, seq_frame(0)], "2 frames, not 3"),
    ([TOPIC, seq_frame(0), msgpack.packb([0.0, []]), b""], "4 frames"),
    ([TOPIC, b"\x00\x01", msgpack.packb([0.0, []])], "sequence frame is 2 bytes"),
    (frames(0, {"ts": 0.0}), "not a batch"),
    (frames(0, [0.0]), "1 fields"),
    (frames(0, ["noon", []]), "batch time 'noon' is not a finite number"),
    (frames(0, [float("nan"), []]), "batch time nan is not a finite number"),
    (frames(0, [0.0, "events"]), "not a batch"),
    (frames(0, [0.0, [7]]), "an event is a int"),
    (frames(0, [0.0, [{"block_hashes": [1]}]]), "without a string 'type'"),
    (frames(0, [0.0, [{"type": "BlockRemoved"}]]), "BlockRemoved without block_hashes"),
    (frames(0, [0.0, [{"type": "BlockRemoved", "block_hashes": [1.5]}]]), "a block hash is a float"),
    (frames(0, [0.0, [{"type": "BlockRemoved", "block_hashes": 1}]]), "block_hashes is a int"),
    (frames(0, [0.0, [["BlockStored", [1], None, [1, "two"], 16, None]]]), "a token id is a str"),
    (frames(0, [0.0, [["BlockStored", [1], None, [1], 0, None]]]), "block_size 0 is not positive"),
    (frames(0, [0.0, [["BlockStored", [1], None]]]), "BlockStored array has 2 fields"),
    (frames(0, [0.0, [], "rank"]), "data_parallel_rank is a str"),
    ([TOPIC, seq_frame(0), msgpack.packb([0.0, []]) + b"\x01"], "1 bytes after the batch"),
    ([TOPIC, seq_frame(0), msgpack.packb([0.0, [[1, 2, 3]]])[:-2]], "ends inside the batch"),
])
def test_a_malformed_message_is_one_kvframeerror_with_a_short_reason(bad, reason):
    with pytest.raises(KVFrameError, match=reason) as info:
        decode_batch(bad)
    assert len(str(info.value)) <= 120


def test_random_bytes_never_escape_as_anything_but_kvframeerror():
    rng = __import__("random").Random(51)
    for n in range(300):
        payload = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
        try:
            decode_batch([TOPIC, seq_frame(n), payload])
        except KVFrameError:
            pass
    with pytest.raises(KVFrameError):
        decode_batch([TOPIC, seq_frame(0), os.urandom(4096)])


def test_ten_million_events_cost_a_capped_batch_in_bounded_time_and_memory():
    n = 10_000_000
    payload = b"\x93" + msgpack.packb(1.0) + b"\xdd" + n.to_bytes(4, "big") + b"\x91\xa1X" * n + b"\x00"
    message = [TOPIC, seq_frame(9), payload]  # 30 MB: under the size cap, so it is decoded
    batch = decode_batch(message)  # stops reading at the cap: the rest is counted, never walked event by event
    assert (batch.num_unknown, batch.num_left_out, batch.events) == (MAX_EVENTS, n - MAX_EVENTS, ())
    assert batch.dp_rank is None  # behind the events it did not read
    tracemalloc.start()
    try:
        decode_batch(message)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # the payload is read through, never copied whole nor built into a list


def test_huge_arrays_inside_an_event_and_oversized_messages_are_refused_before_decoding():
    huge = b"\x92" + msgpack.packb(0.0) + b"\x91" + b"\x92\xacBlockRemoved\xdd" + (3 << 20).to_bytes(4, "big")
    with pytest.raises(KVFrameError, match="max_array_len"):
        decode_batch([TOPIC, seq_frame(0), huge + b"\x01" * (3 << 20)])
    with pytest.raises(KVFrameError, match="refused"):
        decode_batch([TOPIC, seq_frame(0), bytes(65 << 20)])


def test_a_stored_run_keeps_only_its_first_token_ids():
    ids = list(range(50_000))
    batch = decode_batch(frames(0, [0.0, [{"type": "BlockStored", "block_hashes": list(range(1, 3126)),
                                           "parent_block_hash": None, "token_ids": ids, "block_size": 16}]]))
    stored = batch.events[0]
    assert stored.token_ids == tuple(range(MAX_TOKEN_IDS))
    assert stored.token_ids_left_out == 50_000 - MAX_TOKEN_IDS and len(stored.block_hashes) == 3125
