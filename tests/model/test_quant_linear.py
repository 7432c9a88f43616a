"""QuantLinear and QuantEmbedding compute from a GGUF file's blocks what a dense layer computes from the
same weights dequantized; a projection of parts of different types fills each part's slice."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from batchtop.core_engine.model import quant_linear
from batchtop.core_engine.model.quant_blocks import BLOCK_TYPES, dequantize
from batchtop.core_engine.model.quant_linear import QuantEmbedding, QuantLinear
from tests.model.test_quant_blocks import random_rows

K = 256  # one K-quant block a row


def blocks(type_name: str, rows: int, k: int = K, seed: int = 0) -> torch.Tensor:
    from batchtop.core_engine.model.quant_blocks import block_shape
    return torch.from_numpy(random_rows(type_name, rows, k // block_shape(type_name)[0], seed))


@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_the_reference_forward_is_f_linear_on_the_dequantized_weight(type_name, monkeypatch):
    monkeypatch.setattr(quant_linear.quant_kernels, "usable", lambda type_name: False)
    b, bias = blocks(type_name, 48), torch.randn(48)
    layer = QuantLinear(K, [(type_name, b)], bias)
    x = torch.randn(5, K)
    torch.testing.assert_close(layer(x), F.linear(x, dequantize(b, type_name), bias), rtol=0, atol=0)
    assert layer(x[None]).shape == (1, 5, 48)  # leading dims kept
    xb = x.to(torch.bfloat16)
    want = F.linear(xb, dequantize(b, type_name).to(torch.bfloat16), bias.to(torch.bfloat16))
    layer.bias.data = bias.to(torch.bfloat16)
    assert layer(xb).dtype == torch.bfloat16 and torch.equal(layer(xb), want)


def test_parts_of_different_types_each_fill_their_slice_of_the_output(monkeypatch):
    """A Q4_K_M file's qkv: q and k Q4_K (one block matrix), v Q6_K (its own)."""
    monkeypatch.setattr(quant_linear.quant_kernels, "usable", lambda type_name: False)
    qk, v, bias = blocks("Q4_K", 64, seed=1), blocks("Q6_K", 32, seed=2), torch.randn(96)
    layer = QuantLinear(K, [("Q4_K", qk), ("Q6_K", v)], bias)
    assert layer.out_features == 96 and layer.types == ("Q4_K", "Q6_K")
    x = torch.randn(3, K)
    weight = torch.cat((dequantize(qk, "Q4_K"), dequantize(v, "Q6_K")))
    torch.testing.assert_close(layer(x), F.linear(x, weight, bias), rtol=0, atol=0)


def test_a_large_weight_is_dequantized_a_chunk_of_rows_at_a_time_with_the_same_result(monkeypatch):
    monkeypatch.setattr(quant_linear.quant_kernels, "usable", lambda type_name: False)
    b, bias = blocks("Q4_1", 100), torch.randn(100)
    layer = QuantLinear(K, [("Q4_1", b)], bias)
    x = torch.randn(4, K)
    whole = layer(x)
    monkeypatch.setattr(quant_linear, "CHUNK_WEIGHTS", 7 * K)  # 15 chunks, the last one short
    torch.testing.assert_close(layer(x), whole, rtol=1e-5, atol=1e-5)  # the GEMM may sum in another order


def test_the_embedding_dequantizes_the_rows_it_looks_up_and_a_tied_lm_head_shares_its_blocks():
    table = torch.nn.Parameter(blocks("Q8_0", 40), requires_grad=False)
    embed = QuantEmbedding(table, "Q8_0", K, torch.bfloat16)
    ids = torch.tensor([[3, 39], [0, 3]])
    got = embed(ids)
    assert got.shape == (2, 2, K) and got.dtype == torch.bfloat16
    assert torch.equal(got, dequantize(table.data, "Q8_0")[ids].to(torch.bfloat16))
    head = QuantLinear(K, [("Q8_0", table)])
    model = torch.nn.ModuleDict({"embed": embed, "head": head})
    assert head.blocks[0] is table and len(list(model.parameters())) == 1  # one copy of the blocks


def test_silu_mul_runs_only_as_the_kernels_epilogue(monkeypatch):
    layer = QuantLinear(K, [("Q4_1", blocks("Q4_1", 64))], halves=True)
    x = torch.randn(2, K, dtype=torch.bfloat16)
    monkeypatch.setattr(quant_linear.quant_kernels, "usable", lambda type_name: False)
    assert layer.silu_mul(x) is None  # the MLP then runs the projection and silu_and_mul itself


@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_the_kernel_agrees_with_the_reference_within_its_activation_rounding(type_name, monkeypatch):
    if not quant_linear.quant_kernels.usable(type_name):
        pytest.skip(f"the kernels do not run {type_name} here")
    layer = QuantLinear(K, [(type_name, blocks(type_name, 64))], torch.randn(64, dtype=torch.bfloat16), halves=True)
    x = torch.randn(3, K, dtype=torch.bfloat16)
    fast, fused = layer(x), layer.silu_mul(x)
    monkeypatch.setattr(quant_linear.quant_kernels, "usable", lambda type_name: False)
    slow = layer(x)
    # the kernel rounds each activation row to int8 blocks of 32 (llama.cpp's way): ~0.5% of the largest output
    assert (fast.float() - slow.float()).abs().max() <= 0.02 * slow.float().abs().max()
    gate, up = slow.float().chunk(2, dim=-1)
    want = F.silu(gate) * up
    assert (fused.float() - want).abs().max() <= 0.03 * want.abs().max()
