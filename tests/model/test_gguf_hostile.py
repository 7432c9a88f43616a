"""Hostile GGUF headers (issue 41) are refused fast and small, naming the file and the key, tensor or
byte at fault: counts that claim more bytes than the file has, arrays past the caps or nested deep,
strings cut short or not UTF-8, impossible tensor tables. What a valid file holds reads exactly as the
`gguf` package reads it."""

from __future__ import annotations

import re
import struct
import tracemalloc

import gguf
import numpy as np
import pytest

from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.model.gguf_file import read_header
from batchtop.core_engine.model.gguf_reader import MAX_ARRAY_ITEMS, read_gguf_header
from tests.model.gguf_bytes import (ARRAY, F32, STRING, U8, U32, array, header, kv, llama_keys, nested, tensor,
                                    text, with_data)
from tests.support.deadline import returns_within
from tests.support.gguf_files import Q, plain_llama, write_gguf

BASE = llama_keys()
PAD = kv("general.name", STRING, "x" * 356)  # makes the first file 832 bytes, as the issue's


def array_of(kind: int, count: int, body: bytes) -> bytes:
    return struct.pack("<IQ", kind, count) + body


HOSTILE = {  # name: (the file's bytes, what the refusal says after "FILE: ")
    "u8 array claiming 2^40 items": (
        header(BASE + [PAD, kv("junk.bytes", ARRAY, array(U8, list(range(16)), count=2**40))]),
        r"truncated or corrupt: metadata key 'junk.bytes': array of u8 at byte \d+ claims 1,099,511,627,776 "
        r"items \(at least 1,099,511,627,776 bytes\); 16 bytes remain in the file"),
    "string array claiming 2^40 items": (
        header(BASE + [kv("tokenizer.ggml.tokens", ARRAY, array(STRING, ["a", "b"], count=2**40))]),
        r"metadata key 'tokenizer.ggml.tokens': array of string at byte \d+ claims 1,099,511,627,776 items"),
    "key/value count past the end": (
        header(BASE, kv_count=2**40),
        r"truncated or corrupt: the metadata: the key/value count at byte 24 claims 1,099,511,627,776 items"),
    "tensor count past the end": (
        header(BASE, tensor_count=1000),
        r"truncated or corrupt: the tensor table: the tensor count at byte \d+ claims 1,000 items \(at least 32,000 "
        r"bytes\); 0 bytes remain"),
    "2^33 tensors": (header(BASE, tensor_count=2**33), r"the header lists 8,589,934,592 tensors; at most 16,384"),
    "65,537 keys": (header(BASE, kv_count=65_537) + bytes(900_000), r"the header lists 65,537 keys; at most 65,536"),
    "2^16 + 1 nested arrays": (
        header(BASE + [kv("junk.nested", ARRAY, array_of(ARRAY, 2**16 + 1, struct.pack("<IQ", U8, 0) * (2**16 + 1)))]),
        r"metadata key 'junk.nested': array at byte \d+ brings the metadata's nested arrays to 65,537; at most "
        r"65,536 are allowed in all"),
    "2^20 + 1 strings in two arrays": (
        header(BASE + [kv("tokenizer.ggml.tokens", ARRAY, array(STRING, ["a"])),
                       kv("tokenizer.ggml.merges", ARRAY, array_of(STRING, 2**20, text("") * 2**20))]),
        r"metadata key 'tokenizer.ggml.merges': array at byte \d+ brings the metadata's strings to 1,048,577; at "
        r"most 1,048,576 are allowed in all"),
    "one array past the cap": (
        header(BASE + [kv("junk.bytes", ARRAY, array_of(U8, MAX_ARRAY_ITEMS + 1, bytes(MAX_ARRAY_ITEMS + 1)))]),
        r"metadata key 'junk.bytes': array at byte \d+ has 1,048,577 items; at most 1,048,576 are allowed in one "
        r"array"),
    "arrays past the cap together": (
        header(BASE + [kv(f"junk.{i}", ARRAY, array_of(U8, MAX_ARRAY_ITEMS, bytes(MAX_ARRAY_ITEMS)))
                       for i in range(3)]),
        r"metadata key 'junk.2': array at byte \d+ brings the metadata's array items to 3,145,728; at most "
        r"2,097,152 are allowed in all"),
    "arrays nested 3,000 deep": (
        header(BASE + [kv("junk.nested", ARRAY, nested(3000))]),
        r"metadata key 'junk.nested': arrays nested more than 4 deep \(at byte \d+\)"),
    "a string value cut short": (
        header(BASE + [kv("tokenizer.chat_template", STRING, "x" * 50)])[:-20],
        r"truncated: metadata key 'tokenizer.chat_template': string value at byte \d+ needs 50 bytes; the file ends "
        r"at byte \d+; download or copy it again"),
    "a key cut short": (
        header(BASE + [kv("tokenizer.ggml.model", STRING, "gpt2"), text("tokenizer.ggml.tokens")[:12]]),
        r"truncated: metadata entry 10: key at byte \d+ needs 21 bytes; the file ends at byte \d+"),
    "a string of 2^63 bytes": (
        header(BASE + [kv("general.license", STRING, "mit")[:-11] + struct.pack("<Q", 2**63) + b"mit"]),
        r"metadata key 'general.license': string value at byte \d+ is 9,223,372,036,854,775,808 bytes long; at "
        r"most 16,777,216 are allowed"),
    "a key of 2^40 bytes": (
        header(BASE + [struct.pack("<Q", 2**40) + b"general.name"]),
        r"metadata entry 9: key at byte \d+ is 1,099,511,627,776 bytes long; at most 65,535"),
    "a key given twice": (
        header(BASE + [kv("llama.block_count", U32, 3)]),
        r"metadata key 'llama.block_count' appears twice"),
    "an unknown value type": (
        header(BASE + [text("junk.kind") + struct.pack("<I", 99) + b"\0" * 8]),
        r"metadata key 'junk.kind': unknown value type 99"),
    "an array of an unknown type": (
        header(BASE + [kv("junk.kind", ARRAY, struct.pack("<IQ", 42, 1) + b"\0")]),
        r"metadata key 'junk.kind': array at byte \d+ has unknown item type 42"),
    "a key that is not UTF-8": (
        header(BASE + [kv("junk.name", STRING, "x")[:8] + b"\xff" * 9 + struct.pack("<I", STRING) + text("x")]),
        r"metadata entry 9: key at byte \d+ is not UTF-8"),
    "a token that is not UTF-8": (
        header(BASE + [kv("tokenizer.ggml.tokens", ARRAY, array(STRING, ["a", b"\xc3"]))]),
        r"metadata key 'tokenizer.ggml.tokens': string 1 of the array \(at byte \d+\) is not UTF-8"),
    "version 1": (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), r"GGUF version 1 is not supported \(supported: 2, 3\)"),
    "big-endian": (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), r"a big-endian GGUF file; batchtop reads little-endian"),
    "alignment not a power of two": (
        header(BASE + [kv("general.alignment", U32, 24)]),
        r"metadata key 'general.alignment' must be a power of two, got 24"),
    "a tensor of 9 dimensions": (
        header(BASE, [tensor("token_embd.weight", [1] * 9)]),
        r"tensor 'token_embd.weight': 9 dimensions at byte \d+; a tensor has 1 to 4"),
    "a tensor name of 2^40 bytes": (
        header(BASE, [struct.pack("<Q", 2**40) + b"x" * 40]),
        r"tensor 0: tensor name at byte \d+ is 1,099,511,627,776 bytes long; at most 64"),
    "a tensor of an unknown type": (
        with_data(header(BASE, [tensor("output_norm.weight", [64], 250)]), bytes(256)),
        r"tensor 'output_norm.weight' has an unknown type number 250"),
    "a tensor listed twice": (
        with_data(header(BASE, [tensor("output_norm.weight", [64]), tensor("output_norm.weight", [64], 0, 256)]),
                  bytes(512)),
        r"tensor 'output_norm.weight' appears twice in the tensor table"),
    "tensors that overlap": (
        with_data(header(BASE, [tensor("output_norm.weight", [64]), tensor("blk.0.attn_norm.weight", [64], 0, 128)]),
                  bytes(512)),
        r"tensor 'blk.0.attn_norm.weight' starts at byte \d+, inside tensor 'output_norm.weight'"),
    "a tensor of 2^62 elements": (
        with_data(header(BASE, [tensor("token_embd.weight", [2**31, 2**31])]), bytes(64)),
        r"truncated: tensor 'token_embd.weight' ends at byte \d+ \(the file has \d+ bytes\)"),
    "a quantized row not a whole block": (
        with_data(header(BASE, [tensor("output_norm.weight", [33], int(Q.Q8_0))]), bytes(64)),
        r"tensor 'output_norm.weight' has rows of 33 values, not a whole number of Q8_0 blocks of 32"),
}


def refusal(path) -> tuple[str, int]:
    """read_header's refusal and the peak memory the attempt traced; fails when it takes over 2 s."""
    def attempt():
        try:
            read_header(path)
        except BadInput as exc:
            return str(exc)
        return "accepted"
    tracemalloc.start()
    try:
        message = returns_within(2.0, attempt)
        return message, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_header_is_refused_in_under_2_s_and_a_few_mb_naming_file_and_key(tmp_path, case):
    data, message = HOSTILE[case]
    path = tmp_path / "h.gguf"
    path.write_bytes(data)
    got, peak = refusal(path)
    assert got.startswith(f"{path}: ") and re.search(message, got), got
    assert peak < 8 * len(data) + (16 << 20), f"{peak:,} bytes traced to refuse a {len(data):,}-byte file"


def test_every_key_and_tensor_reads_as_the_gguf_package_reads_them(tmp_path):
    """The bounded reader in place of gguf.GGUFReader changes nothing on a valid file: same values of the
    same types, same tensor table, same data offset (both tokenizer kinds, quantized and float tensors)."""
    for kind, quant in (("gpt2", Q.Q4_1), ("llama", Q.F16)):
        path = tmp_path / f"{kind}.gguf"
        write_gguf(path, plain_llama(), "llama", quant, kind)
        ours = read_gguf_header(path)
        theirs = gguf.GGUFReader(path)
        expected = {}
        for name, field in theirs.fields.items():
            if not name.startswith("GGUF."):
                value = field.contents()
                expected[name] = value.tolist() if isinstance(value, np.ndarray) else value
        assert ours.metadata == expected
        assert {k: type(v) for k, v in ours.metadata.items()} == {k: type(v) for k, v in expected.items()}
        assert [(t.name, t.dims, t.type_number, ours.data_start + t.offset) for t in ours.tensors] == \
            [(t.name, tuple(t.shape.tolist()), int(t.tensor_type), int(t.data_offset)) for t in theirs.tensors]
        header_ = read_header(path)
        for t in theirs.tensors:
            info = header_.tensors[t.name]
            assert (info.offset, info.nbytes, info.type_name) == \
                (int(t.data_offset), int(t.n_bytes), t.tensor_type.name)


def test_a_file_cut_inside_its_header_names_the_key_and_byte(tmp_path):
    path = tmp_path / "good.gguf"
    write_gguf(path, plain_llama(), "llama", Q.Q8_0)
    data = path.read_bytes()
    end = data.index(b"tokenizer.ggml.token_type") - 20  # inside the vocabulary's last strings
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:end])
    got, _ = refusal(cut)
    assert re.fullmatch(rf"{re.escape(str(cut))}: truncated: metadata key 'tokenizer.ggml.tokens': (the length of )?"
                        rf"string \d+ of the array at byte \d+ needs \d+ bytes; the file ends at byte {end}; "
                        "download or copy it again", got), got


def test_a_float_array_keeps_float32_values_and_a_bool_array_bools(tmp_path):
    path = tmp_path / "arrays.gguf"
    path.write_bytes(header(BASE + [kv("junk.f", ARRAY, array(F32, [0.1, -2.5])),
                                    kv("junk.b", ARRAY, struct.pack("<IQ", 7, 3) + b"\x00\x01\x02")]))
    metadata = read_gguf_header(path).metadata
    assert metadata["junk.f"] == [float(np.float32(0.1)), -2.5] and metadata["junk.b"] == [False, True, True]


def test_a_header_past_the_size_cap_is_refused_before_it_is_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr("batchtop.core_engine.model.gguf_reader.MAX_HEADER_BYTES", 4096)
    path = tmp_path / "big.gguf"
    path.write_bytes(header(BASE + [kv("tokenizer.chat_template", STRING, "x" * 5000)]))
    with pytest.raises(BadInput, match=r"big.gguf: metadata key 'tokenizer.chat_template': string value at byte \d+ "
                                       r"would take the header past 4,096 bytes, more than any model's metadata"):
        read_header(path)
