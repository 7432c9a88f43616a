"""One KV-event message of vLLM's ZMQ publisher decoded into frozen events, with bounded work.

A message is three frames: topic, an 8-byte big-endian sequence number, and a msgpack payload
`[ts, events]` or `[ts, events, dp_rank]`. vLLM 0.32 sends each event as a map keyed by "type";
0.22/0.23 sent positional arrays led by the tag (`["BlockStored", hashes, parent, token_ids,
block_size, lora_id, medium]`). Both decode to the same events. The payload comes off a socket anyone
can write to, so the decoder refuses oversized messages before touching them, streams the event list
and stops at a cap (saying how many it left out), keeps only the first token ids of a stored run, and
turns every malformed shape into one KVFrameError.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

MAX_MESSAGE_BYTES = 64 << 20  # refused before decoding: vLLM's batches are kilobytes
MAX_EVENTS = 100_000  # events applied per batch; the rest are counted as left out
MAX_HASHES = 1_000_000  # block hashes kept per batch, all events together
MAX_TOKEN_IDS = 1024  # token ids kept per stored run (its first): a prefix's text needs only its start
_MAX_ARRAY = 1 << 21  # any array inside one event (msgpack refuses longer ones before building them)
_MAX_BIN = 1 << 16  # a bytes hash is 32 bytes; a medium or lora name a few
SEQ_BYTES = 8

BlockHash = int | bytes


class KVFrameError(ValueError):
    """A message that is not a KV-event batch; the reason is short enough for a panel."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[BlockHash, ...]  # a chain: each block's parent is the one before it
    parent_block_hash: BlockHash | None  # the parent of the first block; None at a prompt's start
    token_ids: tuple[int, ...]  # the run's first token ids (at most MAX_TOKEN_IDS)
    block_size: int
    medium: str | None = None  # "GPU", "CPU" (offloaded copies), None from servers that do not say
    token_ids_left_out: int = 0


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    seq: int
    ts: float  # the server's unix time of the batch
    events: tuple[KVEvent, ...]
    dp_rank: int | None  # None when the publisher omits it, or when the event list was cut short
    num_unknown: int = 0  # events of a type this decoder does not know, skipped
    num_left_out: int = 0  # events past the caps, not decoded


def _seq(frame: bytes) -> int:
    if len(frame) != SEQ_BYTES:
        raise KVFrameError(f"sequence frame is {len(frame)} bytes, not {SEQ_BYTES}")
    return int.from_bytes(frame, "big")


def _hash(value: Any, what: str) -> BlockHash:
    if isinstance(value, bool) or not isinstance(value, (int, bytes)):
        raise KVFrameError(f"{what} is a {type(value).__name__}, not an int or bytes")
    return value


def _hashes(value: Any) -> tuple[BlockHash, ...]:
    if not isinstance(value, list):
        raise KVFrameError(f"block_hashes is a {type(value).__name__}, not an array")
    return tuple(_hash(h, "a block hash") for h in value)


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise KVFrameError(f"{what} is a {type(value).__name__}, not an int")
    return value


def _medium(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise KVFrameError(f"medium is a {type(value).__name__}, not a string")
    return value


def _stored(hashes: Any, parent: Any, token_ids: Any, block_size: Any, medium: Any) -> BlockStored:
    if not isinstance(token_ids, list):
        raise KVFrameError(f"token_ids is a {type(token_ids).__name__}, not an array")
    size = _int(block_size, "block_size")
    if size <= 0:
        raise KVFrameError(f"block_size {size} is not positive")
    kept = tuple(_int(t, "a token id") for t in token_ids[:MAX_TOKEN_IDS])
    return BlockStored(_hashes(hashes), None if parent is None else _hash(parent, "parent_block_hash"),
                       kept, size, _medium(medium), len(token_ids) - len(kept))


def _from_map(event: dict[str, Any]) -> KVEvent | None:
    kind = event.get("type")
    try:
        if kind == "BlockStored":
            return _stored(event["block_hashes"], event.get("parent_block_hash"), event["token_ids"],
                           event["block_size"], event.get("medium"))
        if kind == "BlockRemoved":
            return BlockRemoved(_hashes(event["block_hashes"]), _medium(event.get("medium")))
    except KeyError as exc:
        raise KVFrameError(f"{kind} without {exc.args[0]}") from None
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    if not isinstance(kind, str):
        raise KVFrameError("an event map without a string 'type'")
    return None


def _from_array(event: list[Any]) -> KVEvent | None:
    kind, fields = (event[0], event[1:]) if event else (None, [])
    if kind == "BlockStored":
        if len(fields) < 4:
            raise KVFrameError(f"BlockStored array has {len(fields)} fields, not at least 4")
        medium = fields[5] if len(fields) > 5 else None  # after lora_id, from 0.10 on
        return _stored(fields[0], fields[1], fields[2], fields[3], medium)
    if kind == "BlockRemoved":
        if not fields:
            raise KVFrameError("BlockRemoved array without block_hashes")
        return BlockRemoved(_hashes(fields[0]), _medium(fields[1] if len(fields) > 1 else None))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    if not isinstance(kind, str):
        raise KVFrameError("an event array without a string tag")
    return None


def _event(raw: Any) -> KVEvent | None:
    """The event, or None for a type this decoder does not know."""
    if isinstance(raw, dict):
        return _from_map(raw)
    if isinstance(raw, list):
        return _from_array(raw)
    raise KVFrameError(f"an event is a {type(raw).__name__}, not a map or an array")


def _unpacker(payload: bytes) -> msgpack.Unpacker:
    """Read through a file view of the payload, which feed() would copy whole before the cap could act."""
    return msgpack.Unpacker(io.BytesIO(payload), raw=False, max_buffer_size=max(len(payload), 1),
                            max_array_len=_MAX_ARRAY, max_map_len=256, max_str_len=_MAX_BIN, max_bin_len=_MAX_BIN,
                            max_ext_len=0)


def _decode_payload(seq: int, payload: bytes) -> KVEventBatch:
    unpacker = _unpacker(payload)
    fields = unpacker.read_array_header()
    if fields not in (2, 3):
        raise KVFrameError(f"batch array has {fields} fields, not 2 or 3")
    ts = unpacker.unpack()
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        raise KVFrameError(f"batch time {ts!r:.20} is not a finite number")
    num_events = unpacker.read_array_header()  # streamed: the list itself is never built
    events: list[KVEvent] = []
    unknown = hashes = read = 0
    while read < num_events and read < MAX_EVENTS and hashes < MAX_HASHES:
        event = _event(unpacker.unpack())
        read += 1
        if event is None:
            unknown += 1
            continue
        if not isinstance(event, AllBlocksCleared):
            hashes += len(event.block_hashes)
        events.append(event)
    left_out = num_events - read
    dp_rank = None
    if left_out == 0:
        if fields == 3:
            rank = unpacker.unpack()
            dp_rank = None if rank is None else _int(rank, "data_parallel_rank")
        if unpacker.tell() != len(payload):
            raise KVFrameError(f"{len(payload) - unpacker.tell()} bytes after the batch")
    return KVEventBatch(seq, float(ts), tuple(events), dp_rank, unknown, left_out)


def decode_batch(frames: Sequence[bytes]) -> KVEventBatch:
    """Decode one message's frames (topic, seq, payload); KVFrameError says what is wrong with it."""
    if len(frames) != 3:
        raise KVFrameError(f"{len(frames)} frames, not 3 (topic, seq, payload)")
    size = sum(len(f) for f in frames)
    if size > MAX_MESSAGE_BYTES:
        raise KVFrameError(f"message of {size >> 20} MiB refused (over {MAX_MESSAGE_BYTES >> 20} MiB)")
    seq = _seq(frames[1])
    try:
        return _decode_payload(seq, bytes(frames[2]))
    except KVFrameError:
        raise
    except msgpack.OutOfData:
        raise KVFrameError("payload ends inside the batch") from None
    except (msgpack.UnpackException, ValueError, TypeError) as exc:  # ExtraData, FormatError, StackError
        raise KVFrameError(f"payload is not a batch: {type(exc).__name__}: {exc}"[:120]) from None
