"""A GGUF file's header (metadata and tensor table), read under bounds the file itself sets, so a
hostile or broken header is refused by name within a fraction of a second and a few megabytes.

No count is believed before it is held against the bytes that remain: an array of n items of a type
needs at least n times that type's smallest encoding, a string its length, a table of n tensors n
minimal entries. Besides, nesting depth, array lengths (each and all together), string lengths, the
numbers of keys and tensors and the header's total size are capped well above any real model's (the
largest vocabularies, ~260k tokens, and their merges are well under a million strings), so that the
worst header within the caps still reads in about a second. The file is read in growing chunks up to
the header cap, never mapped: a file cut while it is read is a truncation, not a crash. Strings decode
as strict UTF-8 and arrays keep their nesting.

The `gguf` package then does what it does well on the validated table: type sizes, byte shapes and
dequantization (gguf_file.py, gguf_weights.py). Its own reader walks arrays one Python call per item
and believes every count (issue 41: 2^40 claimed items ran for minutes); it is not used.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchtop.core_engine.errors import BadInput

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # version 1 used 32-bit counts; no current tool writes it
STRING, ARRAY = 8, 9
BOOL = 7
# value type -> (name, struct format) for the fixed-size types
SCALARS = {0: ("u8", "<B"), 1: ("i8", "<b"), 2: ("u16", "<H"), 3: ("i16", "<h"), 4: ("u32", "<I"),
           5: ("i32", "<i"), 6: ("f32", "<f"), BOOL: ("bool", "<B"), 10: ("u64", "<Q"), 11: ("i64", "<q"),
           12: ("f64", "<d")}
MIN_BYTES = {STRING: 8, ARRAY: 12} | {t: struct.calcsize(f) for t, (_, f) in SCALARS.items()}
MAX_KEY_BYTES = (1 << 16) - 1  # the GGUF specification's own limit on a key
MAX_TENSOR_NAME_BYTES = 64  # ggml's GGML_MAX_NAME
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_DEPTH = 4  # arrays of arrays; llama.cpp's converters write none
MAX_STRING_BYTES = 16 << 20
MAX_ARRAY_ITEMS = 1 << 20  # one array; a 262k-token vocabulary is a quarter of it
# every array together: items (tokens, types, scores, merges), and of those the ones built one by one
MAX_IN_ALL = {"array items": 1 << 21, "strings": 1 << 20, "nested arrays": 1 << 16}
MAX_KEYS = 1 << 16  # a real file has ~50
MAX_TENSORS = 1 << 14  # a 126-layer Llama has 1,137
MAX_HEADER_BYTES = 64 << 20  # metadata and tensor table; a large vocabulary's header is ~10 MB
FIRST_CHUNK = 1 << 20
DEFAULT_ALIGNMENT = 32
_LENGTH = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class RawTensor:
    name: str
    dims: tuple[int, ...]  # as the file lists them (innermost first)
    type_number: int
    offset: int  # relative to the start of the data section


@dataclass(frozen=True, slots=True)
class RawHeader:
    version: int
    metadata: dict[str, Any]
    tensors: list[RawTensor]
    data_start: int  # absolute offset of the data section (aligned)
    file_size: int


class _Refused(Exception):
    """Raised inside the walk; read_gguf_header turns it into a BadInput naming the file."""


def _kind(type_number: int) -> str:
    return "string" if type_number == STRING else "array" if type_number == ARRAY else SCALARS[type_number][0]


class _Walker:
    """The file's bytes from the start, read on demand up to MAX_HEADER_BYTES, with a cursor."""

    def __init__(self, f, size: int) -> None:
        self.f, self.size = f, size
        self.buf = bytearray()
        self.pos = 0
        self.counts = dict.fromkeys(MAX_IN_ALL, 0)  # array items so far, all arrays together
        self.where = "the header"  # what is being read, for messages

    def need(self, n: int, what: str) -> None:
        end = self.pos + n
        if end <= len(self.buf):
            return
        if end > self.size:
            raise _Refused(f"truncated: {self.where}: {what} at byte {self.pos} needs {n} bytes; the file ends at "
                           f"byte {self.size}")
        if end > MAX_HEADER_BYTES:
            raise _Refused(f"{self.where}: {what} at byte {self.pos} would take the header past "
                           f"{MAX_HEADER_BYTES:,} bytes, more than any model's metadata")
        want = min(max(end, 2 * len(self.buf), FIRST_CHUNK), self.size, MAX_HEADER_BYTES)
        chunk = self.f.read(want - len(self.buf))
        self.buf += chunk
        if len(self.buf) < end:  # the file shrank while it was read
            raise _Refused(f"truncated: {self.where}: the file ended at byte {len(self.buf)} while it was read")

    def claim(self, count: int, each: int, what: str) -> None:
        """`count` items of at least `each` bytes must fit in what remains of the file."""
        remain = self.size - self.pos
        if count * each > remain:
            raise _Refused(f"truncated or corrupt: {self.where}: {what} at byte {self.pos} claims {count:,} items "
                           f"(at least {count * each:,} bytes); {remain:,} bytes remain in the file")

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        value = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value[0] if len(value) == 1 else value

    def string(self, what: str, limit: int = MAX_STRING_BYTES) -> str:
        n = self.unpack("<Q", f"{what}'s length")
        if n > limit:
            raise _Refused(f"{self.where}: {what} at byte {self.pos - 8} is {n:,} bytes long; at most {limit:,} "
                           "are allowed")
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Refused(f"{self.where}: {what} at byte {self.pos - n} is not UTF-8 ({exc.reason} at its byte "
                           f"{exc.start})") from None

    def value(self, type_number: int, depth: int = 0) -> Any:
        if type_number == STRING:
            return self.string("string value")
        if type_number == ARRAY:
            return self.array(depth + 1)
        if type_number not in SCALARS:
            raise _Refused(f"{self.where}: unknown value type {type_number} at byte {self.pos - 4}")
        value = self.unpack(SCALARS[type_number][1], f"{_kind(type_number)} value")
        return bool(value) if type_number == BOOL else value

    def array(self, depth: int) -> list:
        if depth > MAX_DEPTH:
            raise _Refused(f"{self.where}: arrays nested more than {MAX_DEPTH} deep (at byte {self.pos})")
        item_type, count = self.unpack("<IQ", "array header")
        if item_type not in MIN_BYTES:
            raise _Refused(f"{self.where}: array at byte {self.pos - 12} has unknown item type {item_type}")
        if count * MIN_BYTES[item_type] > self.size - self.pos:  # the message is built only when it is needed
            self.claim(count, MIN_BYTES[item_type], f"array of {_kind(item_type)}")
        if count > MAX_ARRAY_ITEMS:
            raise _Refused(f"{self.where}: array at byte {self.pos - 12} has {count:,} items; at most "
                           f"{MAX_ARRAY_ITEMS:,} are allowed in one array")
        self._count("array items", count)
        if item_type in (STRING, ARRAY):  # a Python object each, built one by one
            self._count("strings" if item_type == STRING else "nested arrays", count)
        if item_type in SCALARS:
            size = count * MIN_BYTES[item_type]
            if self.pos + size > len(self.buf):
                self.need(size, f"array of {count:,} {_kind(item_type)}")
            # one expression: the view of the growing buffer is gone before the buffer grows again
            values = np.frombuffer(self.buf, SCALARS[item_type][1], count, self.pos)
            self.pos += size
            return (values != 0).tolist() if item_type == BOOL else values.tolist()
        if item_type == STRING:
            return self.strings(count)
        return [self.array(depth + 1) for _ in range(count)]

    def _count(self, kind: str, count: int) -> None:
        total = self.counts[kind] + count
        if total > MAX_IN_ALL[kind]:
            raise _Refused(f"{self.where}: array at byte {self.pos - 12} brings the metadata's {kind} to {total:,}; "
                           f"at most {MAX_IN_ALL[kind]:,} are allowed in all")
        self.counts[kind] = total

    def strings(self, count: int) -> list[str]:
        """An array's strings: a vocabulary's hot loop (labels are built only for errors)."""
        out: list[str] = []
        append, length = out.append, _LENGTH.unpack_from
        buf, pos = self.buf, self.pos
        for i in range(count):
            if pos + 8 > len(buf):
                self.pos = pos
                self.need(8, f"the length of string {i} of the array")
            n, = length(buf, pos)
            start = pos + 8
            pos = start + n
            if pos > len(buf) or n > MAX_STRING_BYTES:
                self.pos = start
                if n > MAX_STRING_BYTES:
                    raise _Refused(f"{self.where}: string {i} of the array (at byte {start - 8}) is {n:,} bytes "
                                   f"long; at most {MAX_STRING_BYTES:,} are allowed")
                self.need(n, f"string {i} of the array")
            try:
                append(buf[start:pos].decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise _Refused(f"{self.where}: string {i} of the array (at byte {start}) is not UTF-8 ({exc.reason} "
                               f"at its byte {exc.start})") from None
        self.pos = pos
        return out

    def tensor(self, index: int) -> RawTensor:
        self.where = f"tensor {index}"
        name = self.string("tensor name", MAX_TENSOR_NAME_BYTES)
        self.where = f"tensor {name!r}"
        n_dims = self.unpack("<I", "dimension count")
        if not 1 <= n_dims <= MAX_DIMS:
            raise _Refused(f"{self.where}: {n_dims} dimensions at byte {self.pos - 4}; a tensor has 1 to {MAX_DIMS}")
        dims = self.unpack(f"<{n_dims}Q", "dimensions")
        dims = dims if isinstance(dims, tuple) else (dims,)
        type_number, offset = self.unpack("<IQ", "type and offset")
        return RawTensor(name, tuple(int(d) for d in dims), type_number, offset)


def _walk(w: _Walker) -> RawHeader:
    w.need(min(4, w.size), "magic")
    if bytes(w.buf[:4]) != MAGIC:
        raise _Refused(f"not a GGUF file (it starts with {bytes(w.buf[:4])!r}; a GGUF file starts with {MAGIC!r})")
    w.pos = 4
    version = w.unpack("<I", "version")
    if version & 0xFFFF == 0 and version:
        raise _Refused("a big-endian GGUF file; batchtop reads little-endian ones (what llama.cpp writes on x86 "
                       "and ARM)")
    if version not in VERSIONS:
        raise _Refused(f"GGUF version {version} is not supported (supported: {', '.join(map(str, VERSIONS))})")
    tensor_count, kv_count = w.unpack("<QQ", "counts")
    w.where = "the metadata"
    w.claim(kv_count, 8 + 4 + 1, "the key/value count")  # key length, type, a 1-byte value at least
    for count, what, most in ((kv_count, "keys", MAX_KEYS), (tensor_count, "tensors", MAX_TENSORS)):
        if count > most:
            raise _Refused(f"the header lists {count:,} {what}; at most {most:,} are allowed")
    metadata: dict[str, Any] = {}
    for i in range(kv_count):
        w.where = f"metadata entry {i}"
        key = w.string("key", MAX_KEY_BYTES)
        w.where = f"metadata key {key!r}"
        if key in metadata:
            raise _Refused(f"{w.where} appears twice (again at byte {w.pos - 8 - len(key.encode())})")
        metadata[key] = w.value(w.unpack("<I", "value type"))
    w.where = "the tensor table"
    w.claim(tensor_count, 8 + 4 + 8 + 4 + 8, "the tensor count")  # the smallest entry: 1-D, empty name
    tensors = [w.tensor(i) for i in range(tensor_count)]
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < 1 or alignment & (alignment - 1):
        raise _Refused(f"metadata key 'general.alignment' must be a power of two, got {alignment!r}")
    data_start = -(-w.pos // alignment) * alignment
    return RawHeader(version, metadata, tensors, data_start, w.size)


def read_gguf_header(path: Path) -> RawHeader:
    """The header of the GGUF file at `path`; BadInput naming the file and the key, tensor or byte at fault."""
    try:
        with open(path, "rb") as f:
            size = path.stat().st_size
            return _walk(_Walker(f, size))
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror or exc})") from None
    except _Refused as exc:
        message = str(exc)
        if message.startswith("truncated"):
            message += "; download or copy it again"
        raise BadInput(f"{path}: {message}") from None
