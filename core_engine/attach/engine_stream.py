"""A batchtop server's step stream, read: the header checked as a trace file's is, then every line checked
by the trace's schema and decoded by the trace's own SnapshotDecoder, so a viewer draws the same
snapshots a replay of the recording would. A line that is not one (not JSON, a field of the wrong type,
a step naming a request it never announced, longer than MAX_LINE_BYTES) is counted and skipped.

A keyframe (the "stream_sync" control the server sends first and after a viewer fell behind) comes out
as one snapshot flagged `synced`, its announcement arrivals removed: they are no news.
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.serve.step_stream import STEPS_PATH, SYNC
from batchtop.core_engine.text_files import NotText
from batchtop.core_engine.trace.codec import SnapshotDecoder
from batchtop.core_engine.trace.schema import ENGINE_EVENTS, event_problem
from batchtop.core_engine.trace.trace import check_header, parse_event

MAX_LINE_BYTES = 8 << 20  # a step is a few KB; a keyframe with thousands of waiting requests a few MB
READ_TIMEOUT_S = 5.0  # the server writes a heartbeat every second: this long silent, it is gone
CHUNK_BYTES = 1 << 16
StreamBroken = (OSError, http.client.HTTPException)  # no server, a reset, a read timed out, a torn chunk


class StreamRefused(BadInput):
    """The server answered, but not with a step stream (status says why: 401 key, 404 no stream)."""

    def __init__(self, url: str, status: int, message: str) -> None:
        super().__init__(message)
        self.url, self.status = url, status


@dataclass(frozen=True, slots=True)
class StreamItem:
    """One decoded snapshot, the end of the stream (end: the reason), or neither: a heartbeat (the server
    has been quiet for a second: what a viewer holds back, it may show now)."""

    snapshot: StepSnapshot | None = None
    synced: bool = False  # a keyframe: the viewer's history restarts its count of drops here
    dropped: int = 0  # steps the server dropped for this viewer so far (on a keyframe)
    end: str | None = None


def steps_url(url: str) -> str:
    """A server's base URL (or its /metrics URL) -> its step stream."""
    base = url.rstrip("/")
    base = base.removesuffix("/metrics")
    return base if base.endswith(STEPS_PATH) else base + STEPS_PATH


class EngineStream:
    """One connection: open() reads the header, items() yields the rest until the end or a close().
    http.client, as attach's scrapes use, not httpx (whose import pulls in Rich)."""

    def __init__(self, url: str, api_key: str | None = None, *, read_timeout_s: float = READ_TIMEOUT_S) -> None:
        self.url = steps_url(url if "://" in url else f"http://{url}")
        self._headers = {"Accept": "application/x-ndjson"}
        if api_key is not None:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self.read_timeout_s = read_timeout_s
        self._conn: http.client.HTTPConnection | None = None
        self._lines: Iterator[bytes] | None = None
        self._decoder: SnapshotDecoder | None = None
        self.header: dict = {}
        self.num_bad_lines = 0
        self.last_problem: str | None = None  # what the newest skipped line was wrong with
        self.num_lines = 0

    def open(self) -> dict:
        """Connect and read the header; StreamRefused when the server has no stream for us, OSError (or
        http.client's HTTPException) when there is no server."""
        parts = urlsplit(self.url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = self._conn = kind(parts.hostname, parts.port, timeout=self.read_timeout_s)
        conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=self._headers)
        response = conn.getresponse()
        if response.status != 200:
            self.close()
            what = {401: "needs its API key (--api-key, or BATCHTOP_API_KEY)",
                    404: "offers no step stream (not a batchtop serve, or an older one)"}
            raise StreamRefused(self.url, response.status,
                                f"{self.url}: {what.get(response.status, f'answered {response.status}')}")
        self._lines = _lines(iter(lambda: response.read1(CHUNK_BYTES), b""), self)
        first = next((raw for raw in self._lines if raw.strip()), None)
        if first is None:
            raise StreamRefused(self.url, 200, f"{self.url}: the stream ended before its header")
        try:
            header = parse_event(first)
            check_header(self.url, 1, header)
        except (NotText, BadInput) as exc:
            raise StreamRefused(self.url, 200, f"{self.url}: not a batchtop step stream ({exc})") from None
        num_blocks = (header.get("config") or {}).get("num_kv_blocks")
        self._decoder = SnapshotDecoder(num_blocks if type(num_blocks) is int else None)
        self.header = header
        return header

    def items(self) -> Iterator[StreamItem]:
        """Every snapshot the stream completes, then one item with `end` (the server's reason, or why the
        connection ended without one)."""
        assert self._lines is not None and self._decoder is not None, "open() first"
        pending_sync: dict | None = None
        try:
            for raw in self._lines:
                if not raw.strip():
                    yield StreamItem()  # a heartbeat
                    continue
                self.num_lines += 1
                try:
                    event = parse_event(raw)
                    problem = event_problem(event, ENGINE_EVENTS) if event["type"] in ENGINE_EVENTS else None
                    if problem is not None:
                        raise NotText(problem)
                    if event["type"] == "end":
                        yield StreamItem(end=str(event["reason"]))
                        return
                    if event["type"] == "control" and event["name"] == SYNC:
                        value = event.get("value")
                        pending_sync = value if isinstance(value, dict) else {}
                    snap = self._decoder.feed(event) if event["type"] in ENGINE_EVENTS else None
                except (NotText, KeyError, ValueError, TypeError) as exc:
                    self._skip(exc)
                    continue
                if snap is None:
                    continue
                if pending_sync is not None:
                    dropped = pending_sync.get("dropped", 0)
                    controls = tuple(c for c in snap.controls if c[0] != SYNC)
                    yield StreamItem(replace(snap, arrived=(), controls=controls), True,
                                     dropped if type(dropped) is int else 0)
                    pending_sync = None
                else:
                    yield StreamItem(snap)
        except StreamBroken as exc:
            yield StreamItem(end=f"the connection ended without the stream's end ({type(exc).__name__})")
            return
        yield StreamItem(end="the connection closed without the stream's end")

    def _skip(self, exc: Exception) -> None:
        self.num_bad_lines += 1
        self.last_problem = getattr(exc, "message", None) or str(exc)

    def interrupt(self) -> None:
        """Any thread: the socket shut down under a read in progress, which then ends as a broken
        connection does (closing the connection itself is left to the reading thread: http.client's
        objects are not for two threads at once)."""
        conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # never connected, or closed already
                pass

    def close(self) -> None:
        """The reading thread, when done: the connection closed."""
        self.interrupt()
        if self._conn is not None:
            self._conn.close()


def _lines(chunks: Iterator[bytes], stream: EngineStream) -> Iterator[bytes]:
    """Whole lines; one longer than MAX_LINE_BYTES is counted, skipped up to its newline, never held."""
    pending: list[bytes] = []
    held = 0
    skipping = False
    for chunk in chunks:
        *ended, rest = chunk.split(b"\n")
        for raw in ended:
            if skipping:
                skipping = False
            else:
                yield b"".join([*pending, raw]) if pending else raw
            pending, held = [], 0
        if rest and not skipping:
            pending.append(rest)
            held += len(rest)
            if held > MAX_LINE_BYTES:
                stream._skip(NotText(f"a line longer than {MAX_LINE_BYTES >> 20} MiB"))
                pending, held, skipping = [], 0, True
