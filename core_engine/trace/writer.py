"""The file side of every batchtop.trace (sessions and attach recordings alike): JSON Lines, gzip when
the name ends in .gz, one write per whole line, flushed per step so a reader (or a crash) sees every
complete line, fsynced on error and at close."""

from __future__ import annotations

import datetime
import errno
import gzip
import io
import json
import os
import zlib

TRACE_FORMAT = "batchtop.trace"
TRACE_VERSION = 1


class TraceWriter:
    def __init__(self, path: str, header: dict) -> None:
        """Writes the header line at once: a trace with no header is no trace."""
        self.path = path
        self._raw = open(path, "wb")  # into what the path names: a FIFO or /dev/stdout is written, not replaced
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", mtime=0) if str(path).endswith(".gz") else None
        self._out = io.TextIOWrapper(self._gz or self._raw, encoding="utf-8", newline="\n", write_through=True)
        self._seq = 0
        self.closed = False
        self.write({"type": "header", "format": TRACE_FORMAT, "version": TRACE_VERSION,
                    "start_time": datetime.datetime.now(datetime.timezone.utc).isoformat(), **header}, t=0.0)
        self.flush()

    def write(self, event: dict, t: float) -> None:
        line = json.dumps({"seq": self._seq, "t": round(t, 6), **event},
                          separators=(",", ":"), allow_nan=False)  # a NaN is a bug: fail loudly, never write it
        self._out.write(line + "\n")
        self._seq += 1

    def flush(self, sync: bool = False) -> None:
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
        self._out.close()  # closes the gzip member (writing its trailer) and the file
        if self._gz is not None:
            self._raw.close()
        self.closed = True
