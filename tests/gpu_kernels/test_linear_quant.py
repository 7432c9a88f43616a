"""linear_quant: GGUF block matrices (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) times bf16 rows, against gguf's own
dequantizer and a float64 matmul; each row's result the same alone and in any batch, bit for bit; the
bias and the three epilogues; bad calls refused with the reason."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from batchtop.gpu_kernels import cpu_kernels, quant_kernels
from batchtop.gpu_kernels.quant_kernels import QUANT_TYPES
from tests.gpu_kernels.quant_helpers import block_matrix, dequantized, reference_and_bound
from tests.support.torch_threads import threads

TYPES = tuple(QUANT_TYPES)
pytestmark = pytest.mark.skipif(not all(quant_kernels.usable(t) for t in TYPES),
                                reason="needs batchtop's CPU kernels built with linear_quant (AVX2, FMA and F16C)")


def features(type_name: str) -> int:
    """K: an odd number of 32-weight blocks for the small types (the last sub-block has no pair)."""
    return 512 if QUANT_TYPES[type_name].block_size == 256 else 352


def test_the_type_table_is_ggmls():
    for name, t in QUANT_TYPES.items():
        assert (t.block_size, t.block_bytes) == GGML_QUANT_SIZES[GGMLQuantizationType[name]]
        assert t.ggml_id == int(GGMLQuantizationType[name])
    assert QUANT_TYPES["Q4_1"].bits_per_weight == 5.0 and QUANT_TYPES["Q6_K"].bits_per_weight == 6.5625


@pytest.mark.parametrize("rows", [1, 5, 19])
@pytest.mark.parametrize("type_name", TYPES)
def test_each_type_matches_its_dequantized_weights(type_name, rows):
    """n = 37: the column tiles end in a partial one; 19 rows: two full row tiles and a partial one."""
    n, k = 37, features(type_name)
    blocks = block_matrix(type_name, n, k, seed=rows)
    w = dequantized(blocks, type_name)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
    with torch.inference_mode():
        got = quant_kernels.linear_quant(x, blocks, type_name, None, n).double().numpy()
    ref, bound = reference_and_bound(x, w)
    assert np.all(np.abs(got - ref) <= bound), np.max(np.abs(got - ref) / bound)
    # the worst case above is loose (errors cancel); typically the 8-bit activations cost well under 2%
    assert np.linalg.norm(got - ref) < 0.02 * np.linalg.norm(ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("type_name", TYPES)
def test_a_row_is_bitwise_the_same_alone_in_any_batch_and_on_any_threads(type_name, dtype):
    n, k = 70, features(type_name)
    blocks = block_matrix(type_name, n, k)
    x = torch.randn(21, k).to(dtype)
    x[3, :32] *= 100  # one block of one row far larger: its scale must not reach the other rows
    with torch.inference_mode(), threads(1):
        alone = torch.cat([quant_kernels.linear_quant(x[r:r + 1], blocks, type_name, None, n) for r in range(21)])
        for rows in (2, 7, 8, 9, 16, 21):
            assert torch.equal(quant_kernels.linear_quant(x[:rows], blocks, type_name, None, n), alone[:rows]), rows
    with torch.inference_mode(), threads(2):
        assert torch.equal(quant_kernels.linear_quant(x, blocks, type_name, None, n), alone)


@pytest.mark.parametrize("type_name", ["Q4_1", "Q6_K"])
def test_the_bias_is_added_before_the_bf16_rounding(type_name):
    n, k = 40, features(type_name)
    blocks = block_matrix(type_name, n, k)
    x = torch.randn(6, k).to(torch.bfloat16)
    bias = (10 * torch.randn(n)).to(torch.bfloat16)
    with torch.inference_mode():
        plain = quant_kernels.linear_quant(x, blocks, type_name, None, n)
        biased = quant_kernels.linear_quant(x, blocks, type_name, bias, n)
    ref, bound = reference_and_bound(x, dequantized(blocks, type_name))
    ref = ref + bias.double().numpy()
    assert np.all(np.abs(biased.double().numpy() - ref) <= bound + np.abs(ref) * 2.0 ** -8)
    assert not torch.equal(plain, biased)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0", "Q4_K"])
def test_the_epilogues_are_bitwise_the_separate_torch_ops(type_name, dtype):
    """add_into: out + y in the activations' dtype, rounded once more; silu_mul over [gate; up] rows: the
    store GEMM followed by cpu_kernels.silu_and_mul."""
    n, k = 96, features(type_name)
    blocks = block_matrix(type_name, n, k)
    bias = torch.randn(n).to(dtype)
    x = torch.randn(11, k).to(dtype)
    residual = (4 * torch.randn(11, n)).to(dtype)
    with torch.inference_mode():
        y = quant_kernels.linear_quant(x, blocks, type_name, bias, n)
        added = residual.clone()
        assert quant_kernels.linear_quant(x, blocks, type_name, bias, n, "add_into", out=added) is added
        assert torch.equal(added, residual + y)
        fused = quant_kernels.linear_quant(x, blocks, type_name, bias, n, "silu_mul")
        assert fused.dtype == dtype and fused.shape == (11, n // 2)
        assert torch.equal(fused, cpu_kernels.silu_and_mul(y))


def test_bad_calls_say_what_is_wrong():
    blocks = block_matrix("Q4_1", 8, 64)
    x = torch.randn(2, 64).to(torch.bfloat16)
    ops = torch.ops.batchtop_cpu
    out = torch.empty(2, 8, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="x must be a 2-D bfloat16"):
        ops.linear_quant(out, x.double(), blocks, 3, None, 0)
    q4k = block_matrix("Q4_K", 8, 256)
    with pytest.raises(RuntimeError, match=r"blocks must be a contiguous \(N, 144\) uint8"):
        ops.linear_quant(out, torch.zeros(2, 256, dtype=torch.bfloat16), q4k[:, :72].contiguous(), 12, None, 0)
    packed = quant_kernels.pack(blocks, "Q4_1")
    if packed is not blocks:  # the op reads Q4_1 from its pack here: the file's blocks are refused
        with pytest.raises(RuntimeError, match="must be pack_linear_quant's pack"):
            ops.linear_quant(out, x, blocks, 3, None, 0)
        with pytest.raises(RuntimeError, match="must be pack_linear_quant's pack"):
            ops.linear_quant(out, x, packed, 2, None, 0)  # a Q4_1 pack is not a Q4_0 one
    with pytest.raises(RuntimeError, match="not a whole number"):
        ops.linear_quant(out, x[:, :48].contiguous(), packed, 3, None, 0)
    with pytest.raises(RuntimeError, match="qtype 7 is not supported"):
        ops.linear_quant(out, x, packed, 7, None, 0)
    with pytest.raises(RuntimeError, match=r"out must be \(2, 8\)"):
        ops.linear_quant(torch.empty(2, 9, dtype=torch.bfloat16), x, packed, 3, None, 0)
    with pytest.raises(RuntimeError, match="bias must be a contiguous"):
        ops.linear_quant(out, x, packed, 3, torch.zeros(7, dtype=torch.bfloat16), 0)
    with pytest.raises(RuntimeError, match="epilogue must be"):
        ops.linear_quant(out, x, packed, 3, None, 5)
    with pytest.raises(ValueError, match="unknown quantized type 'Q5_0'"):
        quant_kernels.linear_quant(x, blocks, "Q5_0", None, 8)
    with pytest.raises(ValueError, match="add_into"):
        quant_kernels.linear_quant(x, blocks, "Q4_1", None, 8, "add_into")
    assert not quant_kernels.usable("Q5_0")
    assert not ops.linear_quant_supported(7)
