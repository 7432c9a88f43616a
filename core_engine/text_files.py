"""Reading the files users hand us (workloads, scripts, calibrations): bounded, UTF-8, or a named error.

A file is read in pieces, never past a cap its caller names (a FIFO fed by `yes` would otherwise fill
the memory): a regular file larger than the cap is refused from its size, a stream once it passes it.
A gzip file (by its magic bytes, whatever its name) is gunzipped on the fly, the cap counting what it
inflates to. A leading UTF-8 byte order mark is dropped (Excel and Notepad write one), and the rest
must decode as UTF-8: a bad byte is reported with its line and column, never as a traceback or a
silently replaced character. JSON parsing errors carry their line too.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import stat
import zlib
from collections.abc import Callable
from pathlib import Path

UTF8_BOM = b"\xef\xbb\xbf"
GZIP_MAGIC = b"\x1f\x8b"
MAX_INPUT_BYTES = 1 << 30  # what a caller that names no cap of its own may read
PIECE = 1 << 20


class NotText(ValueError):
    """A file (or one JSON document in it) that cannot be read as what it claims to be."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


def size_words(n: int) -> str:
    """1073741824 -> '1 GiB', 1536 -> '1.5 KiB'."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} bytes"


def input_problem(path: Path, noun: str) -> str | None:
    """Why `path` cannot be opened as a `noun` ("workload file"), in words; None when it can. A FIFO, a
    device or a `<(...)` is fine: it is read as a stream, under the same cap."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            return f"a symlink to {os.readlink(path)}, which does not exist: no such {noun}"
        return f"no such {noun}"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"a symlink loop (it leads back to itself), not a {noun}"
        return f"cannot read: {exc.strerror or exc}"
    if stat.S_ISDIR(st.st_mode):
        return f"is a directory, not a {noun}"
    return None


def read_bytes_bounded(path: Path, limit: int = MAX_INPUT_BYTES, what: str = "an input file") -> bytearray:
    """The file's bytes (gunzipped when it is gzip), at most `limit` of them; NotText naming the cap
    past it, and for a file that cannot be opened or a gzip stream that is damaged."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            head = f.read(2)
            gzipped = head == GZIP_MAGIC
            if stat.S_ISREG(st.st_mode) and not gzipped and st.st_size > limit:
                raise NotText(f"{size_words(st.st_size)}, larger than {size_words(limit)}, the most batchtop "
                              f"reads from {what}")
            source = _Rejoined(head, f)  # a FIFO cannot seek back over the two bytes read
            return _read_capped(gzip.GzipFile(fileobj=source) if gzipped else source, limit, what, gzipped)
    except NotText:
        raise
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:  # a cut or damaged gzip stream
        raise NotText(f"not a readable gzip file ({exc or type(exc).__name__})") from None
    except OSError as exc:
        raise NotText(f"cannot read: {exc.strerror or exc}") from None


class _Rejoined:
    """A stream's first bytes, already read, put back in front of the rest of it."""

    def __init__(self, head: bytes, rest) -> None:
        self.head, self.rest = head, rest

    def read(self, n: int = -1) -> bytes:
        if not self.head:
            return self.rest.read(n)
        out = self.head if n < 0 else self.head[:n]
        self.head = self.head[len(out):]
        return out


def _read_capped(source, limit: int, what: str, gzipped: bool) -> bytearray:
    data = bytearray()
    while True:
        piece = source.read(min(PIECE, limit + 1 - len(data)))
        if not piece:
            return data
        data += piece
        if len(data) > limit:
            inflated = " once gunzipped" if gzipped else ""
            raise NotText(f"more than {size_words(limit)}{inflated}, the most batchtop reads from {what}")


def decode_utf8(data: bytes | bytearray) -> str:
    """data as text, BOM dropped; NotText naming the line and column of the first bad byte."""
    start = len(UTF8_BOM) if data.startswith(UTF8_BOM) else 0
    try:
        return str(memoryview(data)[start:], "utf-8")  # no copy of a large file's bytes
    except UnicodeDecodeError as exc:
        bad = start + exc.start
        line = data.count(b"\n", start, bad) + 1
        column = bad - max(data.rfind(b"\n", start, bad) + 1, start) + 1
        raise NotText(f"not UTF-8 text (byte 0x{data[bad]:02x} at column {column})", line) from None


def read_text_file(path: Path, limit: int = MAX_INPUT_BYTES, what: str = "an input file") -> str:
    """The file's text, read as read_bytes_bounded reads it; NotText for an unreadable file, one past
    the cap, or bytes that are not UTF-8."""
    return decode_utf8(read_bytes_bounded(path, limit, what))


def first_surrogate(text: str) -> int | None:
    """Where a lone surrogate (JSON's "\\ud800" alone, or one a template wrote) sits in the text, if
    one does: it is not a character, and no tokenizer takes it."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as exc:
        return exc.start


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str, *, allow_constants: bool = True) -> object:
    """json.loads with every failure as NotText: bad syntax (with its line), NaN/Infinity when not
    allowed, an integer with thousands of digits, nesting too deep for the parser."""
    parse_constant: Callable[[str], float] | None = None if allow_constants else _no_constant
    try:
        return json.loads(text, parse_constant=parse_constant)
    except json.JSONDecodeError as exc:
        raise NotText(f"not JSON ({exc.msg})", exc.lineno) from None
    except ValueError as exc:  # NaN/Infinity refused, or an integer over Python's digit limit
        raise NotText(f"not JSON ({exc})") from None
    except RecursionError:
        raise NotText("not JSON (nested too deeply)") from None
