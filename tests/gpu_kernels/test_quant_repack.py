"""quant_kernels.pack: the 16-column repack of Q4_0, Q4_1 and Q8_0 is built once per block matrix, follows
the blocks when they are written to, and leaves the other types' blocks as they are."""

from __future__ import annotations

import pytest
import torch

from batchtop.gpu_kernels import quant_kernels
from batchtop.gpu_kernels.quant_kernels import QUANT_TYPES
from tests.gpu_kernels.quant_helpers import block_matrix

pytestmark = pytest.mark.skipif(not all(quant_kernels.usable(t) for t in QUANT_TYPES),
                                reason="needs batchtop's CPU kernels built with linear_quant")
REPACKED = ("Q4_0", "Q4_1", "Q8_0")


def repacks_here() -> bool:
    blocks = block_matrix("Q4_1", 16, 64)
    return quant_kernels.pack(blocks, "Q4_1") is not blocks


@pytest.mark.parametrize("type_name", REPACKED)
def test_a_pack_is_built_once_and_follows_writes_to_its_blocks(type_name):
    n, k = 40, 96
    blocks, other = block_matrix(type_name, n, k, seed=1), block_matrix(type_name, n, k, seed=2)
    x = torch.randn(3, k).to(torch.bfloat16)
    first = quant_kernels.pack(blocks, type_name)
    assert quant_kernels.pack(blocks, type_name) is first
    before = quant_kernels.linear_quant(x, blocks, type_name, None, n)
    expected = quant_kernels.linear_quant(x, other, type_name, None, n)
    assert not torch.equal(before, expected)
    blocks.copy_(other)  # written in place: the old pack must not be used
    assert torch.equal(quant_kernels.linear_quant(x, blocks, type_name, None, n), expected)


def test_the_pack_is_dropped_with_its_blocks():
    if not repacks_here():
        pytest.skip("no repacked kernel on this CPU")
    blocks = block_matrix("Q8_0", 16, 64)
    quant_kernels.pack(blocks, "Q8_0")
    held = len(quant_kernels._packs)
    del blocks
    assert len(quant_kernels._packs) == held - 1


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K"])
def test_types_without_a_repack_read_their_blocks(type_name):
    blocks = block_matrix(type_name, 8, 256)
    assert quant_kernels.pack(blocks, type_name) is blocks


def test_a_pack_records_its_shape_and_pads_the_last_group():
    if not repacks_here():
        pytest.skip("no repacked kernel on this CPU")
    packed = quant_kernels.pack(block_matrix("Q4_1", 37, 64), "Q4_1")
    # a header row, then three 16-column groups of two 320-byte block records
    assert packed.shape == (4, 2 * 320) and packed.dtype == torch.uint8
    with pytest.raises(RuntimeError, match="pack_linear_quant: blocks must be a contiguous"):
        torch.ops.batchtop_cpu.pack_linear_quant(torch.zeros(4, 30, dtype=torch.uint8), 3)
