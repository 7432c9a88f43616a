"""The file side of every batchtop.trace (sessions and attach recordings alike): JSON Lines, gzip when
the name ends in .gz, one write per whole line, flushed per step so a reader (or a crash) sees every
complete line, fsynced on error and at close. The first write that fails (a full disk, a reader gone)
raises TraceWriteError naming the file and ends the recording: nothing more is written, so the file
holds a prefix of the trace, which reads and replays (a torn last line is dropped with a warning)."""

from __future__ import annotations

import datetime
import errno
import gzip
import io
import json
import os
import zlib
from collections.abc import Callable

from batchtop.core_engine.output_files import OutputError

TRACE_FORMAT = "batchtop.trace"
TRACE_VERSION = 1


class TraceWriteError(OutputError):
    """A trace the disk (or pipe) stopped taking mid-run; names the file and keeps what was written."""

    def __init__(self, path: str, cause: OSError) -> None:
        super().__init__(path, cause)
        self.reason = cause.strerror or str(cause)  # what the system said: No space left on device
        self.strerror = f"cannot write the trace {path}: {self.reason}; recording stopped there"


class TraceWriter:
    def __init__(self, path: str, header: dict) -> None:
        """Writes the header line at once: a trace with no header is no trace."""
        self.path = path
        self._raw = open(path, "wb")  # into what the path names: a FIFO or /dev/stdout is written, not replaced
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", mtime=0) if str(path).endswith(".gz") else None
        self._out = io.TextIOWrapper(self._gz or self._raw, encoding="utf-8", newline="\n", write_through=True)
        self._seq = 0
        self.closed = False
        self.failure: TraceWriteError | None = None  # the write that ended the recording early
        self.write({"type": "header", "format": TRACE_FORMAT, "version": TRACE_VERSION,
                    "start_time": datetime.datetime.now(datetime.timezone.utc).isoformat(), **header}, t=0.0)
        self.flush()

    def write(self, event: dict, t: float) -> None:
        line = json.dumps({"seq": self._seq, "t": round(t, 6), **event},
                          separators=(",", ":"), allow_nan=False)  # a NaN is a bug: fail loudly, never write it
        self._guarded(lambda: self._out.write(line + "\n"))
        self._seq += 1

    def flush(self, sync: bool = False) -> None:
        self._guarded(lambda: self._flush(sync))

    def _guarded(self, io_call: Callable[[], object]) -> None:
        """Every file operation: the first OSError ends the recording, and each later call raises it again."""
        if self.failure is not None:
            raise self.failure
        try:
            io_call()
        except OSError as exc:
            self.failure = TraceWriteError(self.path, exc)
            self._release()
            raise self.failure from exc

    def _release(self) -> None:
        """Let go of the file after a failed write without writing to it again: the descriptor closes
        first, so the bytes the buffers still hold (a torn line, a gzip trailer) never land after a gap."""
        self.closed = True
        for stream in (self._raw.raw, self._out, self._gz, self._raw):
            if stream is not None:
                try:
                    stream.close()
                except (OSError, ValueError):  # a buffer flushing into the closed descriptor
                    pass

    def _flush(self, sync: bool) -> None:
        self._out.flush()
        if self._gz is not None:
            self._gz.flush(zlib.Z_SYNC_FLUSH)  # a reader sees every complete line even before close
        self._raw.flush()
        if sync:
            try:
                os.fsync(self._raw.fileno())
            except OSError as exc:  # a FIFO, a terminal or /dev/null has nothing to sync
                if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EROFS):
                    raise

    def close(self, end: dict, t: float) -> None:
        """The end event (a clean close, unlike a crash), then the gzip trailer and the file."""
        if self.closed:
            return
        self.write({"type": "end", **end}, t=t)
        self.flush(sync=True)
        self._guarded(self._out.close)  # closes the gzip member (writing its trailer) and the file
        if self._gz is not None:
            self._guarded(self._raw.close)
        self.closed = True
