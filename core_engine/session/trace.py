"""Recorded sessions: write a batchtop.trace (JSON Lines, gzip for .gz) and read one back.

Writing is append-only, one write() per complete line, flushed after every step and fsynced on
close and on error, so a crash loses at most the line being written; a clean close ends with
{"type": "end"}. Every event has a strictly increasing `seq` and a monotonic `t` (seconds since
recording began). Reading tolerates a torn last line (with a warning) and refuses anything else
that is broken, naming the line.
"""

from __future__ import annotations

import datetime
import gzip
import io
import json
import os
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.core_engine.session.text import TextDelta
from batchtop.core_engine.session.trace_codec import SnapshotDecoder, SnapshotEncoder

TRACE_FORMAT = "batchtop.trace"
TRACE_VERSION = 1
GZIP_MAGIC = b"\x1f\x8b"


class TraceError(BadInput):
    """An unreadable trace: unknown format, newer version, or a corrupt line (named)."""


class Recorder:
    """Appends a session's events to a trace file; owned by the thread that produces snapshots."""

    def __init__(self, path: str, header: dict, record_text: bool = False) -> None:
        self.path = path
        raw = open(path, "wb")
        self._raw = raw
        self._gz = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) if str(path).endswith(".gz") else None
        self._out = io.TextIOWrapper(self._gz or raw, encoding="utf-8", newline="\n", write_through=True)
        self._t0 = time.monotonic()
        self._seq = 0
        self._encoder = SnapshotEncoder(record_text)
        self.closed = False
        self._write({"type": "header", "format": TRACE_FORMAT, "version": TRACE_VERSION,
                     "start_time": datetime.datetime.now(datetime.timezone.utc).isoformat(), **header,
                     "text": record_text})
        self.flush()

    def _write(self, event: dict) -> None:
        line = json.dumps({"seq": self._seq, "t": round(time.monotonic() - self._t0, 6), **event},
                          separators=(",", ":"))
        self._out.write(line + "\n")
        self._seq += 1

    def record(self, snap: StepSnapshot, text: TextDelta | None = None) -> None:
        """Write what this snapshot says happened (and its text, if recording text); flush once per step."""
        events = self._encoder.events(snap, text)
        for event in events:
            self._write(event)
        if events:
            self.flush()

    def control(self, name: str, value: object = None) -> None:
        """Driver-level events the engine does not see: pause, resume, captions."""
        self._write({"type": "control", "name": name, "value": value})
        self.flush()

    def flush(self, sync: bool = False) -> None:
        self._out.flush()
        if self._gz is not None:
            self._gz.flush(zlib.Z_SYNC_FLUSH)  # a reader sees every complete line even before close
        self._raw.flush()
        if sync:
            os.fsync(self._raw.fileno())

    def error(self, message: str) -> None:
        if not self.closed:
            self._write({"type": "error", "message": message})
            self.flush(sync=True)

    def close(self, reason: str = "finished") -> None:
        if self.closed:
            return
        self._write({"type": "end", "reason": reason})
        self.flush(sync=True)
        self._out.close()  # closes the gzip member (writing its trailer) and the file
        if self._gz is not None:
            self._raw.close()
        self.closed = True


@dataclass
class Trace:
    path: str
    header: dict
    events: list[dict]
    warnings: list[str] = field(default_factory=list)

    @property
    def ended_cleanly(self) -> bool:
        return bool(self.events) and self.events[-1]["type"] == "end"

    def snapshots(self) -> Iterator[tuple[dict, StepSnapshot | None]]:
        """Every event, paired with the snapshot it completes (step and view events) or None."""
        decoder = SnapshotDecoder()
        for event in self.events:
            try:
                yield event, decoder.feed(event)
            except (KeyError, ValueError, TypeError) as exc:
                raise TraceError(f"{self.path}: event seq {event.get('seq')}: inconsistent: {exc}") from None


def _chunks(path: Path) -> Iterator[bytes]:
    """The file's bytes, gunzipped on the fly when it is gzip; a stream cut short just ends early."""
    with path.open("rb") as f:
        head = f.read(2)
        f.seek(0)
        inflate = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16) if head == GZIP_MAGIC else None
        for chunk in iter(lambda: f.read(1 << 16), b""):
            if inflate is None:
                yield chunk
                continue
            try:
                yield inflate.decompress(chunk)
            except zlib.error:
                return  # damaged past this point: what inflated so far still counts
            if inflate.eof:
                return


def _lines(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, complete) — complete is False for a final line without its newline."""
    buffer = b""
    lineno = 0
    for chunk in _chunks(path):
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        for raw in complete:
            lineno += 1
            yield lineno, raw.decode("utf-8", errors="replace"), True
    if buffer:
        yield lineno + 1, buffer.decode("utf-8", errors="replace"), False


def read_trace(path: str) -> Trace:
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{path}: no such trace file")
    header: dict | None = None
    events: list[dict] = []
    warnings: list[str] = []
    last_seq = -1
    for lineno, text, complete in _lines(p):
        if not text.strip():
            continue
        try:
            event = json.loads(text)
            if not isinstance(event, dict) or "type" not in event or "seq" not in event:
                raise ValueError("not a trace event")
        except ValueError as exc:
            if complete:  # every line is written whole with its newline: this one was damaged
                raise TraceError(f"{path}:{lineno}: corrupt line ({exc})") from None
            warnings.append(f"{path}:{lineno}: dropped a truncated last line")
            break
        if header is None:
            if event.get("format") != TRACE_FORMAT:
                raise TraceError(f"{path}:{lineno}: not a batchtop trace (format {event.get('format')!r})")
            version = event.get("version")
            if type(version) is int and version > TRACE_VERSION:  # type(): a JSON true is no version
                raise TraceError(f"{path}:{lineno}: trace version {version} is newer than this "
                                 f"batchtop reads ({TRACE_VERSION}); upgrade batchtop")
            if type(version) is not int or version != TRACE_VERSION:
                raise TraceError(f"{path}:{lineno}: unknown trace version {version!r} (this batchtop reads "
                                 f"version {TRACE_VERSION})")
            header = event
        elif event["seq"] <= last_seq:
            raise TraceError(f"{path}:{lineno}: seq {event['seq']} after {last_seq}: events out of order")
        else:
            events.append(event)
        last_seq = event["seq"]
    if header is None:
        raise TraceError(f"{path}: empty trace (no header line)")
    if not events or events[-1]["type"] != "end":
        warnings.append(f"{path}: no end event: the recording did not close cleanly")
    return Trace(path, header, events, warnings)
