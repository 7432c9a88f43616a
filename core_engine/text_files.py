"""Reading the text files users hand us (workloads, scripts, calibrations): UTF-8 or a named error.

A file is read whole as bytes, a leading UTF-8 byte order mark is dropped (Excel and Notepad write
one), and the rest must decode as UTF-8: a bad byte is reported with its line and column, never as a
traceback or a silently replaced character. JSON parsing errors carry their line too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

UTF8_BOM = b"\xef\xbb\xbf"


class NotText(ValueError):
    """A file (or one JSON document in it) that cannot be read as what it claims to be."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


def decode_utf8(data: bytes) -> str:
    """data as text, BOM dropped; NotText naming the line and column of the first bad byte."""
    if data.startswith(UTF8_BOM):
        data = data[len(UTF8_BOM):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise NotText(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at column {column})", line) from None


def read_text_file(path: Path) -> str:
    """The file's text; NotText for an unreadable file or bytes that are not UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise NotText(f"cannot read: {exc.strerror or exc}") from None
    return decode_utf8(data)


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
