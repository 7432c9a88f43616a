"""What the side streams (a server's step log, its KV events) delivered between two ticks, raw and on
the watch's clock: the recorder writes exactly this, and a replay hands the same back to the monitor."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KVMessage:
    t: float
    frames: tuple[bytes, ...]  # as the PUB socket sent them: topic, 8-byte sequence number, msgpack payload
    replayed: bool = False  # fetched from the replay endpoint to fill a gap


@dataclass(frozen=True, slots=True)
class StreamTick:
    lines: tuple[tuple[float, str], ...] = ()  # (t, a step line as the server logged it)
    kv: tuple[KVMessage, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.lines or self.kv)


NOTHING = StreamTick()
