"""The side streams as the attach monitor keeps them: the logged steps (step_log.py) and the server's
prefix cache rebuilt from its KV events (prefix_cache.py), each fed the raw tick the watch drained or
a replay read back, and viewed once per tick for the frame."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from batchtop.core_engine.attach.streams.kv_event_frames import KVFrameError, decode_batch
from batchtop.core_engine.attach.streams.prefix_cache import PrefixCache, PrefixCacheView
from batchtop.core_engine.attach.streams.step_log import StepLog, StepLogView
from batchtop.core_engine.attach.streams.step_point import StepPricer
from batchtop.core_engine.attach.streams.stream_tick import StreamTick
from batchtop.core_engine.attach.streams.taps import LinkStatus

Decode = Callable[[Sequence[int]], str]


@dataclass(frozen=True, slots=True)
class StreamViews:
    steps: StepLogView | None
    prefix: PrefixCacheView | None
    kv_link: str | None = None  # the live subscriber's words (None in a replay)


class StreamState:
    def __init__(self, *, log: bool, kv: bool, pricer: StepPricer | None = None) -> None:
        self.steps = StepLog(pricer) if log else None
        self.prefix = PrefixCache() if kv else None
        self.decode: Decode | None = None  # the served model's tokenizer, once batchtop can load it

    def take(self, tick: StreamTick) -> None:
        if self.steps is not None:
            for t, line in tick.lines:
                self.steps.add(t, line)
        if self.prefix is not None:
            for message in tick.kv:
                try:
                    batch = decode_batch(list(message.frames))
                except KVFrameError as exc:
                    self.prefix.malformed(str(exc))
                    continue
                self.prefix.apply(batch, message.t)

    def views(self, t: float, link: LinkStatus | None) -> StreamViews:
        steps = self.steps.view(t, link.log if link is not None else None) if self.steps is not None else None
        prefix = self.prefix.view(t, self.decode) if self.prefix is not None else None
        return StreamViews(steps, prefix, link.kv if link is not None else None)
