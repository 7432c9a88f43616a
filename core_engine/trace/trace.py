"""Recorded sessions: write a batchtop.trace (JSON Lines, gzip for .gz) and read one back.

Writing is append-only, one write() per complete line, flushed after every step and fsynced on
close and on error, so a crash loses at most the line being written; a clean close ends with
{"type": "end"}. Every event has a strictly increasing `seq` and a monotonic `t` (seconds since
recording began). Reading tolerates a torn last line (with a warning) and refuses anything else
that is broken, naming the line and field (session/trace_schema.py): a damaged line in the middle,
a gzip stream damaged before its end, a field missing or of the wrong type. Event types it does not
know are skipped with one warning.
"""

from __future__ import annotations

import itertools
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.core_engine.perf.metrics import finite
from batchtop.core_engine.engine.detokenizer import TextDelta
from batchtop.core_engine.text_files import NotText, decode_utf8, input_problem, parse_json
from batchtop.core_engine.trace.codec import SnapshotDecoder, SnapshotEncoder
from batchtop.core_engine.trace.writer import TRACE_FORMAT, TRACE_VERSION, TraceWriteError, TraceWriter
from batchtop.core_engine.trace.schema import (ENGINE_SOURCE, SOURCES, event_problem, framing_problem,
                                                      header_problem)

GZIP_MAGIC = b"\x1f\x8b"
MAX_LINE_BYTES = 64 << 20  # one event: a step is a few KB, a "text" event with whole prompts more


class TraceError(BadInput):
    """An unreadable trace: unknown format, newer version, or a corrupt line (named)."""


class Recorder:
    """Appends a session's events to a trace file. Written by the thread that produces snapshots; any
    thread may close it (a signal that ends the process while that thread is still in a step): each
    call holds a lock, and once closed, with its end event, it writes nothing more. A write that fails
    raises TraceWriteError once (naming the file); the recording is closed from then on."""

    def __init__(self, path: str, header: dict, record_text: bool = False) -> None:
        self.path = path
        self._t0 = time.monotonic()
        self._encoder = SnapshotEncoder(record_text)
        self._lock = threading.Lock()
        # a config value read as NaN (a model's rope_theta) must not stop the recording: null, as in the metrics
        self._writer = TraceWriter(path, finite({**header, "text": record_text}))

    @property
    def closed(self) -> bool:
        return self._writer.closed

    @property
    def failure(self) -> TraceWriteError | None:
        """The write that stopped the recording early, if one did."""
        return self._writer.failure

    def outcome(self) -> str:
        """What the user has on disk, for the driver's last words."""
        if self.failure is None:
            return f"recorded {self.path}"
        return f"recorded {self.path} up to the write that failed: what it holds replays (with a warning)"

    def _write(self, event: dict) -> None:
        self._writer.write(event, t=time.monotonic() - self._t0)

    def record(self, snap: StepSnapshot, text: TextDelta | None = None) -> None:
        """Write what this snapshot says happened (and its text, if recording text); flush once per step."""
        events = self._encoder.events(snap, text)
        with self._lock:
            if self.closed:
                return
            for event in events:
                self._write(event)
            if events:
                self._writer.flush()

    def control(self, name: str, value: object = None) -> None:
        """Driver-level events the engine does not see: pause, resume, captions."""
        with self._lock:
            if not self.closed:
                self._write({"type": "control", "name": name, "value": value})
                self._writer.flush()

    def flush(self, sync: bool = False) -> None:
        with self._lock:
            if not self.closed:
                self._writer.flush(sync)

    def error(self, message: str) -> None:
        with self._lock:
            if not self.closed:
                self._write({"type": "error", "message": message})
                self._writer.flush(sync=True)

    def close(self, reason: str = "finished") -> None:
        with self._lock:
            self._writer.close({"reason": reason}, t=time.monotonic() - self._t0)


@dataclass
class Trace:
    path: str
    header: dict
    events: list[dict]
    warnings: list[str] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # each event's line in the file, for error messages

    @property
    def source(self) -> str:
        """What recorded it: "engine" (a batchtop session), or another source's name (its header's)."""
        return self.header.get("source", ENGINE_SOURCE)

    @property
    def ended_cleanly(self) -> bool:
        return bool(self.events) and self.events[-1]["type"] == "end"

    def snapshots(self) -> Iterator[tuple[dict, StepSnapshot | None]]:
        """Every event, paired with the snapshot it completes (step and view events) or None."""
        num_blocks = (self.header.get("config") or {}).get("num_kv_blocks")
        decoder = SnapshotDecoder(num_blocks if isinstance(num_blocks, int) and not isinstance(num_blocks, bool)
                                  else None)
        for i, event in enumerate(self.events):
            try:
                yield event, decoder.feed(event)
            except (KeyError, ValueError, TypeError) as exc:
                where = f"{self.path}:{self.lines[i]}" if i < len(self.lines) else f"{self.path}: seq {event.get('seq')}"
                raise TraceError(f"{where}: {event.get('type')} event: inconsistent: {exc}") from None


class GzipDamaged(Exception):
    """The compressed stream is broken where more of it follows: corruption, not a cut at the end."""


def _chunks(path: Path) -> Iterator[bytes]:
    """The file's bytes, gunzipped on the fly when it is gzip (every member of a multi-member file).

    A stream that simply stops (a crash mid-write) ends early without complaint; a stream zlib
    refuses (flipped bytes, a wrong checksum) or bytes after its end that start no new member raise
    GzipDamaged: only a cut at the very end counts as truncation."""
    with path.open("rb") as f:
        head = f.read(2)  # no seek back: a FIFO cannot
        chunks = itertools.chain([head] if head else [], iter(lambda: f.read(1 << 16), b""))
        if head != GZIP_MAGIC:
            yield from chunks
            return
        inflate = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
        for chunk in chunks:
            while chunk:
                try:
                    yield inflate.decompress(chunk)
                except zlib.error as exc:
                    raise GzipDamaged(str(exc)) from None
                if not inflate.eof:
                    break
                chunk = inflate.unused_data
                if chunk and not GZIP_MAGIC.startswith(chunk[:2]):
                    raise GzipDamaged("bytes after the end of the gzip stream")
                inflate = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)


def _lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, raw bytes, complete) — complete is False for a final line without its newline.
    A line is held whole until it ends, so one longer than MAX_LINE_BYTES (a FIFO that never sends a
    newline, a gzip bomb) is refused once it passes that, not read until the memory runs out."""
    pending: list[bytes] = []  # the pieces of a line not ended yet
    held = lineno = 0
    for chunk in _chunks(path):
        *ended, rest = chunk.split(b"\n")
        for raw in ended:
            lineno += 1
            yield lineno, b"".join([*pending, raw]) if pending else raw, True
            pending, held = [], 0
        if rest:
            pending.append(rest)
            held += len(rest)
            if held > MAX_LINE_BYTES:
                raise TraceError(f"{path}:{lineno + 1}: a line longer than {MAX_LINE_BYTES >> 20} MiB, the "
                                 "most batchtop reads as one trace event")
    if pending:
        yield lineno + 1, b"".join(pending), False


def parse_event(raw: bytes) -> dict:
    """One line as a trace event; NotText when it is not UTF-8 JSON with a seq, t and type."""
    event = parse_json(decode_utf8(raw), allow_constants=False)
    if not isinstance(event, dict):
        raise NotText("not a trace event (not a JSON object)")
    problem = framing_problem(event)
    if problem is not None:
        raise NotText(f"not a trace event ({problem})")
    return event


def check_header(path: str, lineno: int, event: dict) -> None:
    """A trace's first line (a file's, or a live step stream's): its format, version and engine fields."""
    if event.get("format") != TRACE_FORMAT:
        raise TraceError(f"{path}:{lineno}: not a batchtop trace (format {event.get('format')!r})")
    version = event.get("version")
    if type(version) is int and version > TRACE_VERSION:  # type(): a JSON true is no version
        raise TraceError(f"{path}:{lineno}: trace version {version} is newer than this "
                         f"batchtop reads ({TRACE_VERSION}); upgrade batchtop")
    if type(version) is not int or version != TRACE_VERSION:
        raise TraceError(f"{path}:{lineno}: unknown trace version {version!r} (this batchtop reads "
                         f"version {TRACE_VERSION})")
    if event.get("source", ENGINE_SOURCE) == ENGINE_SOURCE:
        problem = header_problem(event)
        if problem is not None:
            raise TraceError(f"{path}:{lineno}: {problem}")


def read_trace(path: str) -> Trace:
    p = Path(path)
    problem = input_problem(p, "trace file")  # anything else is read as a stream, once: a FIFO or
    if problem is not None:  # <(ssh host cat run.jsonl.gz) works too
        raise TraceError(f"{path}: {problem}")
    header: dict | None = None
    schemas: dict | None = None
    trace = Trace(path, {}, [])
    unknown: dict[str, int] = {}  # unknown event type -> first line
    last_seq, lineno = -1, 0
    try:
        for lineno, raw, complete in _lines(p):
            if not raw.strip():
                continue
            try:
                event = parse_event(raw)
            except NotText as exc:
                if complete:  # every line is written whole with its newline: this one was damaged
                    raise TraceError(f"{path}:{lineno}: corrupt line ({exc.message})") from None
                trace.warnings.append(f"{path}:{lineno}: dropped a truncated last line")
                break
            if event["seq"] <= last_seq:
                raise TraceError(f"{path}:{lineno}: seq {event['seq']} after {last_seq}: events out of order")
            last_seq = event["seq"]
            if header is None:
                check_header(path, lineno, event)
                header = trace.header = event
                schemas = SOURCES.get(trace.source)
                continue
            if schemas is not None:
                if event["type"] not in schemas:
                    unknown.setdefault(event["type"], lineno)
                    continue
                problem = event_problem(event, schemas)
                if problem is not None:
                    raise TraceError(f"{path}:{lineno}: {problem}")
            trace.events.append(event)
            trace.lines.append(lineno)
    except GzipDamaged as exc:
        raise TraceError(f"{path}:{lineno + 1}: corrupt: gzip stream damaged ({exc}); the {lineno} "
                         f"line(s) before it read whole") from None
    if header is None:
        raise TraceError(f"{path}: empty trace (no header line)")
    if unknown:
        trace.warnings.append(f"{path}:{min(unknown.values())}: skipped events of unknown type(s) "
                              f"{', '.join(sorted(unknown))} (a newer batchtop wrote them?)")
    if not trace.events or trace.events[-1]["type"] != "end":
        trace.warnings.append(f"{path}: no end event: the recording did not close cleanly")
    return trace
