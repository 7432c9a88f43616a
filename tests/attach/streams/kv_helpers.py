"""The real capture's KV-event messages, raw and re-encoded the way vLLM 0.22/0.23 sent them, and
frames built by hand for the hostile cases."""

from __future__ import annotations

import msgpack

from batchtop.core_engine.attach.streams.kv_event_frames import KVEventBatch, decode_batch
from tests.support.vllm_step_streams import kv_messages_unix

TOPIC = b"kv-events"
STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")


def capture() -> list[tuple[float, tuple[bytes, ...]]]:
    """(receive unix time, frames) of every message the real vLLM 0.32 server published."""
    return kv_messages_unix()


def raw_payloads() -> list[list]:
    """Each captured payload as plain msgpack reads it: `[ts, [event maps...], dp_rank]`."""
    return [msgpack.unpackb(frames[2], raw=False) for _, frames in capture()]


def seq_frame(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def frames(seq: int, payload: object) -> list[bytes]:
    return [TOPIC, seq_frame(seq), msgpack.packb(payload)]


def as_array_event(event: dict) -> list:
    """One 0.32 event map as 0.22/0.23's tagged positional array."""
    kind = event["type"]
    if kind == "BlockStored":
        return [kind, *(event[f] for f in STORED_FIELDS)]
    if kind == "BlockRemoved":
        return [kind, event["block_hashes"], event["medium"]]
    return [kind]


def array_encoded() -> list[list[bytes]]:
    """The capture re-encoded as 0.22 did: positional events, and the batch without its dp rank."""
    out = []
    for (_, f), payload in zip(capture(), raw_payloads()):
        ts, events = payload[0], payload[1]
        out.append([f[0], f[1], msgpack.packb([ts, [as_array_event(e) for e in events]])])
    return out


def decoded_capture() -> list[tuple[float, KVEventBatch]]:
    """(seconds since the first message, decoded batch) for the whole capture."""
    messages = capture()
    t0 = messages[0][0]
    return [(u - t0, decode_batch(f)) for u, f in messages]
