"""The pre-packed bf16 linear computes exactly what F.linear does, and follows its weight."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from batchtop.core_engine.model.packed_linear import PackedLinear, can_pack

pytestmark = pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.bfloat16),
                                reason="this CPU has no oneDNN bf16 path")


@pytest.mark.parametrize("rows", [1, 5, 64])
def test_packed_output_is_bitwise_that_of_f_linear(rows):
    torch.manual_seed(rows)
    layer = PackedLinear(96, 160, bias=False).to(torch.bfloat16)
    x = torch.randn(rows, 96, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(layer(x), F.linear(x, layer.weight))
    assert layer._packed is not None  # the packed path really ran


def test_writing_the_weight_repacks_it_and_state_dict_stays_plain():
    torch.manual_seed(0)
    layer = PackedLinear(32, 48, bias=False).to(torch.bfloat16)
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    with torch.inference_mode():
        before = layer(x)
    new = torch.randn(48, 32, dtype=torch.bfloat16)
    layer.load_state_dict({"weight": new})
    assert set(layer.state_dict()) == {"weight"}
    with torch.inference_mode():
        after = layer(x)
    assert not torch.equal(before, after) and torch.equal(after, F.linear(x, new))


def test_a_layer_built_under_inference_mode_packs_too():
    with torch.inference_mode():
        layer = PackedLinear(16, 8, bias=False).to(torch.bfloat16)
        x = torch.randn(2, 16, dtype=torch.bfloat16)
        assert torch.equal(layer(x), F.linear(x, layer.weight)) and layer._packed is not None
