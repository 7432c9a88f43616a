"""linear_quant with float32 activations: the same int8 activation blocks and integer dots as bf16, the
result in float32. Held to the float64 reference within the 8-bit activation bound, bitwise the bf16
result before its rounding, batch invariant, the epilogues as the separate float32 ops; a dtype mix refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from batchtop.gpu_kernels import quant_kernels
from batchtop.gpu_kernels.quant_kernels import QUANT_TYPES
from tests.gpu_kernels.quant_helpers import block_matrix, dequantized, reference_and_bound
from tests.gpu_kernels.test_linear_quant import features

TYPES = tuple(QUANT_TYPES)
pytestmark = pytest.mark.skipif(not all(quant_kernels.usable(t) for t in TYPES),
                                reason="needs batchtop's CPU kernels built with linear_quant (AVX2, FMA and F16C)")


def float32_bound(x: torch.Tensor, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """reference_and_bound's bound with the float32 output's rounding (2^-24 relative) for bf16's (2^-8)."""
    ref, bound = reference_and_bound(x, w)
    return ref, bound - np.abs(ref) * 2.0 ** -8 + np.abs(ref) * 2.0 ** -23


@pytest.mark.parametrize("rows", [1, 19])
@pytest.mark.parametrize("type_name", TYPES)
def test_each_type_in_float32_matches_its_dequantized_weights(type_name, rows):
    n, k = 37, features(type_name)
    blocks = block_matrix(type_name, n, k, seed=rows)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))  # float32, not bf16-representable
    with torch.inference_mode():
        got = quant_kernels.linear_quant(x, blocks, type_name, None, n)
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    ref, bound = float32_bound(x, dequantized(blocks, type_name))
    err = np.abs(got.double().numpy() - ref)
    assert np.all(err <= bound), np.max(err / bound)
    assert np.linalg.norm(got.double().numpy() - ref) < 0.02 * np.linalg.norm(ref)


@pytest.mark.parametrize("type_name", TYPES)
def test_float32_is_the_bf16_result_before_its_rounding(type_name):
    """On bf16-valued rows both paths quantize the same activations and take the same dots: the bf16
    result is the float32 one rounded, bit for bit (bias included)."""
    n, k = 45, features(type_name)
    blocks = block_matrix(type_name, n, k)
    x = torch.randn(9, k).to(torch.bfloat16)
    bias = torch.randn(n).to(torch.bfloat16)
    with torch.inference_mode():
        in_bf16 = quant_kernels.linear_quant(x, blocks, type_name, bias, n)
        in_float32 = quant_kernels.linear_quant(x.float(), blocks, type_name, bias.float(), n)
    assert torch.equal(in_float32.to(torch.bfloat16), in_bf16)
    assert not torch.equal(in_float32, in_bf16.float())  # the float32 result keeps the bits bf16 drops


def test_a_dtype_mix_is_refused_naming_the_tensor():
    blocks = quant_kernels.pack(block_matrix("Q4_1", 8, 64), "Q4_1")
    x = torch.randn(2, 64)
    ops = torch.ops.batchtop_cpu
    with pytest.raises(RuntimeError, match=r"out must be \(2, 8\) Float \(x's dtype\).*BFloat16"):
        ops.linear_quant(torch.empty(2, 8, dtype=torch.bfloat16), x, blocks, 3, None, 0)
    with pytest.raises(RuntimeError, match=r"bias must be a contiguous \(8,\) Float \(x's dtype\)"):
        ops.linear_quant(torch.empty(2, 8), x, blocks, 3, torch.zeros(8, dtype=torch.bfloat16), 0)
    with pytest.raises(RuntimeError, match=r"out must be \(2, 8\) BFloat16 \(x's dtype\)"):
        ops.linear_quant(torch.empty(2, 8), x.to(torch.bfloat16), blocks, 3, None, 0)
    with pytest.raises(RuntimeError, match="x must be a 2-D bfloat16 or float32"):
        ops.linear_quant(torch.empty(2, 8, dtype=torch.float64), x.double(), blocks, 3, None, 0)
