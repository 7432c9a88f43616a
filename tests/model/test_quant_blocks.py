"""The torch dequantizer of GGUF blocks computes what the `gguf` package's numpy reference computes, bit for
bit, for every block type a quantized run keeps."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from batchtop.core_engine.model.quant_blocks import BLOCK_TYPES, bits_per_weight, block_shape, dequantize, row_bytes

# byte offsets of each type's fp16 scales: set to finite values so the blocks are ones a file would hold
HALVES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}


def random_rows(type_name: str, rows: int, blocks_a_row: int, seed: int = 0) -> np.ndarray:
    size, nbytes = block_shape(type_name)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, blocks_a_row, nbytes), dtype=np.uint8)
    for offset in HALVES[type_name]:
        raw[..., offset:offset + 2] = rng.normal(0, 0.05, (rows, blocks_a_row, 1)).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_rows_dequantize_bitwise_as_the_gguf_package_does(type_name):
    raw = random_rows(type_name, rows=7, blocks_a_row=3)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name])
    got = dequantize(torch.from_numpy(raw), type_name)
    assert got.dtype == torch.float32 and got.shape == want.shape == (7, 3 * block_shape(type_name)[0])
    assert np.array_equal(got.numpy(), want)


def test_a_block_of_known_bytes_gives_known_weights():
    """Q8_0: one fp16 scale, then 32 signed bytes; Q4_1: scale, minimum, then 32 nibbles (low halves first)."""
    q8 = np.zeros((1, 34), dtype=np.uint8)
    q8[0, :2] = np.array([0.5], dtype=np.float16).view(np.uint8)
    q8[0, 2:] = np.arange(-16, 16, dtype=np.int8).view(np.uint8)
    assert dequantize(torch.from_numpy(q8), "Q8_0")[0].tolist() == [0.5 * v for v in range(-16, 16)]
    q4 = np.zeros((1, 20), dtype=np.uint8)
    q4[0, :4] = np.array([2.0, -1.0], dtype=np.float16).view(np.uint8)
    q4[0, 4:] = 0x31  # low nibble 1 (weights 0-15), high nibble 3 (weights 16-31)
    assert dequantize(torch.from_numpy(q4), "Q4_1")[0].tolist() == [1.0] * 16 + [5.0] * 16


def test_bits_per_weight_are_the_stored_bytes_of_a_block():
    assert {t: bits_per_weight(t) for t in BLOCK_TYPES} == {"Q4_0": 4.5, "Q4_1": 5.0, "Q8_0": 8.5, "Q4_K": 4.5,
                                                             "Q6_K": 6.5625}
    assert row_bytes("Q4_1", 576) == 360


def test_rows_that_are_not_whole_blocks_are_refused():
    with pytest.raises(ValueError, match="whole blocks of 20 bytes"):
        dequantize(torch.zeros((2, 30), dtype=torch.uint8), "Q4_1")
    with pytest.raises(ValueError, match="expected uint8"):
        dequantize(torch.zeros((2, 20)), "Q4_1")
    with pytest.raises(ValueError, match="not a multiple"):
        row_bytes("Q4_K", 576)
