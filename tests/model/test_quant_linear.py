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
    b, bias = blocks(type_name, 64), torch.randn(64, dtype=torch.bfloat16)
    x = torch.randn(3, K, dtype=torch.bfloat16)
    slow = quant_linear.reference_linear(x, b, type_name, bias)
    layer = QuantLinear(K, [(type_name, b)], bias, halves=True)
    fast, fused = layer(x), layer.silu_mul(x)
    # the kernel rounds each activation row to int8 blocks of 32 (llama.cpp's way): ~0.5% of the largest output
    assert (fast.float() - slow.float()).abs().max() <= 0.02 * slow.float().abs().max()
    gate, up = slow.float().chunk(2, dim=-1)
    want = F.silu(gate) * up
    assert (fused.float() - want).abs().max() <= 0.03 * want.abs().max()


def test_while_the_kernels_build_a_linear_keeps_its_dense_weight_then_drops_it(monkeypatch):
    """A first session: the kernels build in the background for under a minute. Dequantizing every weight
    every step would cost ~0.2 s a SmolLM2 step; each layer dequantizes once instead, and lets the copy go
    when the kernels come in."""
    runs = {"kernel": False}
    monkeypatch.setattr(quant_linear, "kernels_coming", lambda: not runs["kernel"])
    monkeypatch.setattr(quant_linear, "kernel_runs", lambda x, type_name: runs["kernel"])
    monkeypatch.setattr(quant_linear.quant_kernels, "linear_quant", lambda x, b, t, bias, n, packed: torch.zeros(x.shape[0], n))
    monkeypatch.setattr(quant_linear.quant_kernels, "pack", lambda b, t: b)
    calls = []
    monkeypatch.setattr(quant_linear, "dequantize", lambda b, t: calls.append(t) or dequantize(b, t))
    b = blocks("Q4_1", 32)
    layer = QuantLinear(K, [("Q4_1", b)])
    x = torch.randn(3, K)
    want = F.linear(x, dequantize(b, "Q4_1"))
    assert torch.equal(layer(x), want) and torch.equal(layer(x), want)
    assert calls == ["Q4_1"]  # once, not once a forward
    runs["kernel"] = True
    assert torch.equal(layer(x), torch.zeros(3, 32))
    assert "_interim" not in layer.__dict__  # the dense copy is gone with the kernels in


def test_a_layer_holds_one_copy_of_its_weight_once_the_kernels_repack_it():
    """Where the kernels read a 16-column repack (Q4_0, Q4_1, Q8_0 on AVX-512 VNNI), the repack replaces the
    file's blocks in the layer; blocks shared with a tied embedding stay, beside their repack."""
    if not quant_linear.quant_kernels.usable("Q4_1"):
        pytest.skip("the kernels do not run Q4_1 here")
    b = blocks("Q4_1", 64)
    if quant_linear.quant_kernels.pack(b, "Q4_1") is b:
        pytest.skip("no repack of Q4_1 on this CPU")
    own, shared = QuantLinear(K, [("Q4_1", b.clone())]), torch.nn.Parameter(b.clone(), requires_grad=False)
    tied = QuantLinear(K, [("Q4_1", shared)])
    x = torch.randn(2, K, dtype=torch.bfloat16)
    first = own(x)
    assert own.repacked == [True] and own.blocks[0].shape != b.shape  # the file's blocks are gone
    assert torch.equal(own(x), first) and torch.equal(tied(x), first)
    assert tied.repacked == [False] and tied.blocks[0] is shared and torch.equal(shared, b)
