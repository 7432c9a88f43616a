"""GGUF files written byte by byte (the format's own layout, little-endian, version 3), for headers no
writer would produce: counts that run past the end of the file, arrays nested thousands deep, a
string cut in the middle. Each builds a small file; nothing here parses one."""

from __future__ import annotations

import struct

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_PACK = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
         U64: "<Q", I64: "<q", F64: "<d"}


def text(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack("<Q", len(raw)) + raw


def scalar(kind: int, value) -> bytes:
    return text(value) if kind == STRING else struct.pack(_PACK[kind], value)


def array(kind: int, values: list, count: int | None = None) -> bytes:
    """An array value (no type tag): item type, count (the real one unless `count` claims another), items."""
    body = b"".join(scalar(kind, v) for v in values)
    return struct.pack("<IQ", kind, len(values) if count is None else count) + body


def nested(depth: int, innermost: bytes = array(U8, [1])) -> bytes:
    """An array of arrays `depth` levels deep around `innermost` (itself an array value)."""
    value = innermost
    for _ in range(depth):
        value = struct.pack("<IQ", ARRAY, 1) + value
    return value


def kv(key: str, kind: int, value) -> bytes:
    """One key/value; `value` is a Python value for a scalar kind, an encoded array value for ARRAY."""
    return text(key) + struct.pack("<I", kind) + (value if kind == ARRAY else scalar(kind, value))


def tensor(name: str | bytes, dims: list[int], type_number: int = 0, offset: int = 0) -> bytes:
    """One tensor-table entry (type 0 is F32)."""
    return text(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, type_number, offset)


def header(pairs: list[bytes], tensors: list[bytes] = (), version: int = 3, kv_count: int | None = None,
           tensor_count: int | None = None) -> bytes:
    """Magic, version, counts (the real ones unless claimed otherwise), key/values, tensor table."""
    kvs = len(pairs) if kv_count is None else kv_count
    n = len(tensors) if tensor_count is None else tensor_count
    return b"GGUF" + struct.pack("<IQQ", version, n, kvs) + b"".join(pairs) + b"".join(tensors)


def with_data(head: bytes, data: bytes, alignment: int = 32) -> bytes:
    """`head` padded to the alignment, then the tensor data."""
    return head + bytes(-len(head) % alignment) + data


def llama_keys(**override) -> list[bytes]:
    """A llama file's architecture keys (a 2-layer model of width 64), with any replaced by `override`
    (key without the 'llama.' prefix -> (kind, value))."""
    keys = {"block_count": (U32, 2), "context_length": (U32, 256), "embedding_length": (U32, 64),
            "feed_forward_length": (U32, 128), "attention.head_count": (U32, 4),
            "attention.head_count_kv": (U32, 2), "rope.freq_base": (F32, 10000.0),
            "attention.layer_norm_rms_epsilon": (F32, 1e-5)}
    keys.update(override)
    return [kv("general.architecture", STRING, "llama")] + [kv(f"llama.{k}", kind, v) for k, (kind, v) in keys.items()]
