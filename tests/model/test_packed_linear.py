"""The pre-packed linear computes what F.linear does (bitwise on oneDNN, within rounding on batchtop's
bf16 kernel and MKL's fp32 one), and follows its weight when it is written to."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from batchtop.core_engine.model.packed_linear import PackedLinear, can_pack, packing

CPU = torch.device("cpu")
DTYPES = [pytest.param(dtype, marks=pytest.mark.skipif(not can_pack(CPU, dtype), reason=f"no packed {dtype} path"))
          for dtype in (torch.bfloat16, torch.float32)]
batchtop_bf16 = pytest.mark.skipif(packing(CPU, torch.bfloat16) != "batchtop",
                                   reason="no batchtop bf16 CPU kernels (AVX512_BF16, or AVX2 and FMA)")


def same_as_f_linear(got: torch.Tensor, expected: torch.Tensor) -> bool:
    if got.dtype == torch.bfloat16 and packing(CPU, torch.bfloat16) == "onednn":
        return torch.equal(got, expected)  # oneDNN with the weight packed ahead: the very same kernel
    if got.dtype == torch.bfloat16:  # fp32 sums in another order, then one rounding: at most an ulp apart
        return torch.allclose(got.float(), expected.float(), rtol=2 ** -7, atol=1e-6)
    return torch.allclose(got, expected, rtol=1e-5, atol=1e-5)  # MKL's packed sgemm: another order


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 13, 16])  # 1-3: padded to 4 rows for oneDNN; 6 a tile on AVX512_BF16
@pytest.mark.parametrize("features", [(96, 160), (1027, 200)])  # odd in, and out not a multiple of 64
def test_packed_output_is_that_of_f_linear(dtype, rows, features):
    torch.manual_seed(rows)
    layer = PackedLinear(*features, bias=True).to(dtype)
    x = torch.randn(rows, features[0], dtype=dtype)
    with torch.inference_mode(), torch.profiler.profile() as prof:
        got = layer(x)
    assert got.shape == (rows, features[1]) and same_as_f_linear(got, F.linear(x, layer.weight, layer.bias))
    ops = {event.key for event in prof.key_averages()}
    assert not ops & {"aten::mm", "aten::addmm", "aten::linear"}, ops  # the packed kernel ran, no fallback


@pytest.mark.parametrize("dtype", DTYPES)
def test_writing_the_weight_repacks_it_and_state_dict_stays_plain(dtype):
    torch.manual_seed(0)
    layer = PackedLinear(32, 48, bias=False).to(dtype)
    x = torch.randn(3, 32, dtype=dtype)
    with torch.inference_mode():
        before = layer(x)
    new = torch.randn(48, 32, dtype=dtype)
    layer.load_state_dict({"weight": new})
    assert set(layer.state_dict()) == {"weight"}
    with torch.inference_mode():
        after = layer(x)
    assert not same_as_f_linear(before, after) and same_as_f_linear(after, F.linear(x, new))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_layer_built_under_inference_mode_packs_too(dtype):
    with torch.inference_mode():
        layer = PackedLinear(16, 8, bias=False).to(dtype)
        x = torch.randn(2, 16, dtype=dtype)
        assert same_as_f_linear(layer(x), F.linear(x, layer.weight)) and layer._packed is not None


@batchtop_bf16
def test_a_row_gets_the_same_bits_alone_and_in_any_batch():
    """Decode's batch invariance rests on this: one sequence's logits must not depend on its neighbours."""
    torch.manual_seed(0)
    layer = PackedLinear(1024, 320, bias=True).to(torch.bfloat16)
    x = torch.randn(20, 2048, dtype=torch.bfloat16)[:, 1:1025]  # rows 2048 apart, read in place
    with torch.inference_mode():
        batch = layer(x)
        for rows in (range(20), range(7, 8), range(3, 16)):
            assert torch.equal(layer(x[rows.start:rows.stop]), batch[rows.start:rows.stop])


@batchtop_bf16
def test_the_kernel_reads_the_weight_it_was_given_not_a_neighbour():
    """Every output column comes from its own weight row: a one-hot weight picks out one input each."""
    torch.manual_seed(0)
    n, k = 130, 70
    pick = torch.randint(0, k, (n,))
    weight = torch.zeros(n, k, dtype=torch.bfloat16)
    weight[torch.arange(n), pick] = 1
    layer = PackedLinear(k, n, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(weight)
    x = torch.randn(9, k).to(torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(layer(x), x[:, pick])
