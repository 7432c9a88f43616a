"""The pre-packed linear computes what F.linear does (bitwise in bf16, within rounding in fp32), and
follows its weight when it is written to."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from batchtop.core_engine.model.packed_linear import PackedLinear, can_pack

CPU = torch.device("cpu")
DTYPES = [pytest.param(dtype, marks=pytest.mark.skipif(not can_pack(CPU, dtype), reason=f"no packed {dtype} path"))
          for dtype in (torch.bfloat16, torch.float32)]


def same_as_f_linear(got: torch.Tensor, expected: torch.Tensor) -> bool:
    if got.dtype == torch.bfloat16:
        return torch.equal(got, expected)  # oneDNN with the weight packed ahead: the very same kernel
    return torch.allclose(got, expected, rtol=1e-5, atol=1e-5)  # MKL's packed sgemm: another order


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 13, 16])  # 1-3: padded to 4 rows for oneDNN
def test_packed_output_is_that_of_f_linear(dtype, rows):
    torch.manual_seed(rows)
    layer = PackedLinear(96, 160, bias=True).to(dtype)
    x = torch.randn(rows, 96, dtype=dtype)
    with torch.inference_mode(), torch.profiler.profile() as prof:
        got = layer(x)
    assert got.shape == (rows, 160) and same_as_f_linear(got, F.linear(x, layer.weight, layer.bias))
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
