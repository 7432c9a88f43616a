"""`attach --vllm-log FILE|-`: a server's log read on its own thread, as `tail -F` would (a file from its
end, reopened when it is rotated or truncated) or from a pipe (`vllm serve ... 2>&1 | batchtop attach URL
--vllm-log -`). Only step lines are kept, raw, with the time they were read (the recorder stores them,
the monitor parses them); every other line is counted. Memory stays bounded whatever comes: lines are
cut out of fixed-size reads, a line longer than MAX_LINE_BYTES is skipped as it streams past, and a
consumer that falls behind loses the oldest lines (counted), never blocks the reader."""

from __future__ import annotations

import os
import select
import stat
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass

from batchtop.core_engine.attach.streams.iteration_log import is_step_line

READ_BYTES = 64 * 1024
MAX_LINE_BYTES = 64 * 1024  # a step line is ~250 bytes; a longer line is some other output
MAX_BUFFERED = 100_000  # step lines waiting for the consumer
POLL_S = 0.05
STDIN = "-"


@dataclass(frozen=True, slots=True)
class ReceivedLine:
    t: float  # on the follower's clock (the watch's)
    text: str


@dataclass(frozen=True, slots=True)
class LogCounts:
    step_lines: int  # step lines read (handed over or dropped)
    other_lines: int  # lines of the server's log that are not step lines
    long_lines: int  # lines over MAX_LINE_BYTES, skipped
    dropped: int  # step lines lost because the consumer fell behind
    reopened: int  # the file was rotated or truncated and read again from its start
    ended: str | None  # why the log stopped ("the pipe closed"), None while it runs


class LogFollower:
    def __init__(self, path: str, *, fd: int | None = None, start_at: int | None = None, clock=time.time) -> None:
        """fd: where a pipe ("-") is read when it is not standard input (the dashboard took the terminal);
        start_at: where in the file to begin (its size when the watch was set up), else its end now."""
        self.path = path
        self._fd = fd
        self._start_at = start_at
        self._clock = clock
        self._buffer: deque[ReceivedLine] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._partial = bytearray()
        self._skipping = False  # inside a line that is too long, until its newline
        self._step = self._other = self._long = self._dropped = self._reopened = 0
        self._ended: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"log {path}", daemon=True)

    def start(self) -> LogFollower:
        self._thread.start()
        return self

    def drain(self) -> list[ReceivedLine]:
        with self._lock:
            out = list(self._buffer)
            self._buffer.clear()
        return out

    def counts(self) -> LogCounts:
        with self._lock:
            return LogCounts(self._step, self._other, self._long, self._dropped, self._reopened, self._ended)

    def close(self, timeout: float = 1.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            if self.path == STDIN:
                self._read_pipe(self._fd if self._fd is not None else sys.stdin.fileno())
            elif stat.S_ISFIFO(os.stat(self.path).st_mode):  # a named pipe: read as it comes, no end to seek
                fd = os.open(self.path, os.O_RDONLY)  # waits for the server to open its end
                try:
                    self._read_pipe(fd)
                finally:
                    os.close(fd)
            else:
                self._follow_file()
        except OSError as exc:
            self._end(f"reading {self.path} failed: {exc.strerror or exc}")

    def _end(self, why: str) -> None:
        with self._lock:
            self._ended = why

    def _read_pipe(self, fd: int) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([fd], [], [], POLL_S)
            if not ready:
                continue
            chunk = os.read(fd, READ_BYTES)
            if not chunk:
                if self._partial:
                    self._feed(b"\n")  # a last line without its newline
                self._end("the log's pipe closed")
                return
            self._feed(chunk)

    def _follow_file(self) -> None:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            end = os.lseek(fd, 0, os.SEEK_END)  # as tail -F: what the server logs from now on ...
            if self._start_at is not None and self._start_at <= end:
                os.lseek(fd, self._start_at, os.SEEK_SET)  # ... or since the watch was set up
            while not self._stop.is_set():
                chunk = os.read(fd, READ_BYTES)
                if chunk:
                    self._feed(chunk)
                    continue
                if self._replaced(fd):
                    os.close(fd)
                    fd = os.open(self.path, os.O_RDONLY)
                    self._partial.clear()
                    with self._lock:
                        self._reopened += 1
                    continue
                self._stop.wait(POLL_S)
        finally:
            os.close(fd)

    def _replaced(self, fd: int) -> bool:
        """The path now names another file (rotated), or this one shrank below where we read (truncated)."""
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return False  # between a rotation's rename and the new file: keep the old one until it appears
        mine = os.fstat(fd)
        return (now.st_ino, now.st_dev) != (mine.st_ino, mine.st_dev) or now.st_size < os.lseek(fd, 0, os.SEEK_CUR)

    def _feed(self, chunk: bytes) -> None:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                break
            self._line(chunk[start:end])
            start = end + 1
        rest = chunk[start:]
        if self._skipping:
            return
        if len(self._partial) + len(rest) > MAX_LINE_BYTES:
            self._partial.clear()
            self._skipping = True
            with self._lock:
                self._long += 1
        else:
            self._partial += rest

    def _line(self, piece: bytes) -> None:
        if self._skipping:
            self._skipping = False  # the newline that ends the too-long line
            return
        if self._partial:
            piece = bytes(self._partial) + piece
            self._partial.clear()
        if len(piece) > MAX_LINE_BYTES:
            with self._lock:
                self._long += 1
            return
        text = piece.decode("utf-8", "replace").rstrip("\r")
        with self._lock:
            if not is_step_line(text):
                self._other += 1
                return
            self._step += 1
            if len(self._buffer) >= MAX_BUFFERED:
                self._buffer.popleft()
                self._dropped += 1
            self._buffer.append(ReceivedLine(self._clock(), text))
