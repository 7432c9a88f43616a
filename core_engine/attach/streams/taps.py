"""The live side streams of an attach watch: the server's log (--vllm-log) and its KV events
(--kv-events), each read on its own thread from the moment the watch starts, drained once per tick onto
the watch's clock."""

from __future__ import annotations

import time
from dataclasses import dataclass

from batchtop.core_engine.attach.streams.kv_subscriber import KVEventSubscriber
from batchtop.core_engine.attach.streams.log_follower import LogCounts, LogFollower
from batchtop.core_engine.attach.streams.stream_tick import KVMessage, StreamTick


@dataclass(frozen=True, slots=True)
class StreamOptions:
    log: str | None = None  # a file to follow, or "-" for standard input
    kv_events: str | None = None  # tcp://HOST:PORT of the KV-event publisher
    kv_replay: str | None = None  # its replay endpoint (None: no gap can be filled)
    kv_topic: str = "kv-events"
    log_fd: int | None = None  # the pipe behind "-" once the dashboard has given standard input to the terminal
    log_from: int | None = None  # the log file's size when the watch was set up: its steps from then on

    def __bool__(self) -> bool:
        return bool(self.log or self.kv_events)


@dataclass(frozen=True, slots=True)
class LinkStatus:
    """How the live streams are doing, for the panels (a replay has none)."""

    log: LogCounts | None
    kv: str | None  # the subscriber's own words: batches, gaps filled, a gap it could not fill


class StreamTaps:
    def __init__(self, opts: StreamOptions, t0_monotonic: float) -> None:
        clock = lambda: time.monotonic() - t0_monotonic  # noqa: E731
        self._unix_offset = time.time() - clock()  # subscriber times are unix; the watch's are its own
        self.log = LogFollower(opts.log, fd=opts.log_fd, start_at=opts.log_from, clock=clock).start() if opts.log else None
        self.kv = KVEventSubscriber(opts.kv_events, opts.kv_replay, opts.kv_topic, catch_up=True) if opts.kv_events else None
        if self.kv is not None:
            self.kv.start()

    def drain(self) -> StreamTick:
        lines = tuple((r.t, r.text) for r in self.log.drain()) if self.log is not None else ()
        kv = tuple(KVMessage(round(m.t_unix - self._unix_offset, 6), tuple(m.frames), m.replayed)
                   for m in self.kv.drain()) if self.kv is not None else ()
        return StreamTick(lines, kv)

    def status(self) -> LinkStatus:
        return LinkStatus(self.log.counts() if self.log is not None else None,
                          self.kv.status_line() if self.kv is not None else None)

    def close(self) -> None:
        for tap in (self.log, self.kv):
            if tap is not None:
                tap.close()
