"""decoder_layers_bf16 with GGUF-quantized linears (linear_types) computes bitwise what the same layers
compute op by op: rms_norm, linear_quant or linear_bf16, rope, the K/V write, paged_attention, the
residual adds and silu_and_mul, each a separate call. That holds too where a few rows over layers of
packed types (Q4_0, Q4_1, Q8_0) run as one team of threads (decoder_layer_cpu.cpp: run_team), whose
attention splits each row's keys between the threads."""

from __future__ import annotations

import pytest
import torch

from batchtop.gpu_kernels import cpu_kernels, quant_kernels
from batchtop.gpu_kernels.quant_kernels import QUANT_TYPES
from tests.gpu_kernels.quant_helpers import block_matrix

pytestmark = pytest.mark.skipif(
    not cpu_kernels.decoder_layer_usable() or not all(quant_kernels.usable(t) for t in QUANT_TYPES),
    reason="needs batchtop's CPU kernels with the bf16 decoder layer and linear_quant")

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, EPS = 256, 4, 2, 64, 512, 1e-5
Q_DIM, KV_DIM = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
WIDTH = Q_DIM + 2 * KV_DIM
# per layer: qkv, o, gate_up, down (None: bf16); every type in some layer, bf16 between them
LAYER_TYPES = [("Q4_K", "Q8_0", "Q4_1", "Q6_K"), (None, "Q4_0", None, "Q4_1"), ("Q4_1", None, "Q8_0", None)]
# every linear packed (the team's layers), each packed type in each place
PACKED_TYPES = [("Q4_1", "Q4_1", "Q4_1", "Q4_1"), ("Q8_0", "Q4_0", "Q8_0", "Q4_0"), ("Q4_0", "Q8_0", "Q4_1", "Q8_0")]


class Linear:
    def __init__(self, type_name: str | None, n: int, k: int, seed: int, halves: bool = False) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.type_name, self.n = type_name, n
        self.bias = (0.1 * torch.randn(n, generator=gen)).to(torch.bfloat16)
        if type_name is None:
            weight = (0.05 * torch.randn(n, k, generator=gen)).to(torch.bfloat16)
            self.plain = cpu_kernels.pack_linear_bf16(weight)
            self.fused = cpu_kernels.pack_linear_bf16(weight, half=n // 2) if halves else self.plain
        else:
            self.plain = block_matrix(type_name, n, k, seed)
            self.fused = quant_kernels.pack(self.plain, type_name)  # what the decoder layer reads

    @property
    def type_id(self) -> int:
        return -1 if self.type_name is None else QUANT_TYPES[self.type_name].ggml_id

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x W^T + b; with out: out += that, rounded as the two torch ops round."""
        if self.type_name is not None:
            return quant_kernels.linear_quant(x, self.plain, self.type_name, self.bias, self.n,
                                              "add_into" if out is not None else "store", out=out)
        y = cpu_kernels.linear_bf16(x, self.plain, self.bias, self.n)
        if out is None:
            return y
        out.copy_(out + y)
        return out


def make_layers(seed: int = 0, layer_types=LAYER_TYPES):
    layers = []
    for i, types in enumerate(layer_types):
        s = 100 * (seed + i)
        norms = [(1 + 0.1 * torch.randn(HIDDEN, generator=torch.Generator().manual_seed(s + j))).to(torch.bfloat16)
                 for j in range(2)]
        linears = [Linear(types[0], WIDTH, HIDDEN, s + 2), Linear(types[1], HIDDEN, Q_DIM, s + 3),
                   Linear(types[2], 2 * INTER, HIDDEN, s + 4, halves=True), Linear(types[3], HIDDEN, INTER, s + 5)]
        layers.append((norms, linears))
    return layers


def step_rows(rows_spec, block: int = 4, blocks: int = 64):
    """Tables for a step: rows_spec (cached, new) per sequence -> slots, block tables, row tables, lengths."""
    perm = torch.randperm(blocks, generator=torch.Generator().manual_seed(1))
    width = max(-(-(c + n) // block) for c, n in rows_spec)
    tables, row_tables, lens, slots = [], [], [], []
    for seq, (cached, new) in enumerate(rows_spec):
        table = perm[seq * width:(seq + 1) * width].tolist()
        tables.append(table)
        for p in range(cached, cached + new):
            row_tables.append(seq), lens.append(p + 1), slots.append(table[p // block] * block + p % block)
    return torch.tensor(slots), torch.tensor(tables), torch.tensor(row_tables), torch.tensor(lens)


def op_by_op(x, layers, pools, cos, sin, slots, tables, row_tables, lens, scale):
    rows = x.shape[0]
    for (norm, post), (qkv_proj, o_proj, gate_up, down), (k_cache, v_cache) in zip(
            (n for n, _ in layers), (l for _, l in layers), pools):
        qkv = qkv_proj(cpu_kernels.rms_norm(x, norm, EPS))
        cpu_kernels.rope_(qkv[:, :Q_DIM + KV_DIM].unflatten(1, (HEADS + KV_HEADS, HEAD_DIM)), cos, sin)
        k_cache.view(-1, KV_DIM)[slots] = qkv[:, Q_DIM:Q_DIM + KV_DIM]
        v_cache.view(-1, KV_DIM)[slots] = qkv[:, Q_DIM + KV_DIM:]
        attn = cpu_kernels.paged_attention(qkv[:, :Q_DIM].unflatten(1, (HEADS, HEAD_DIM)), k_cache, v_cache,
                                           tables, row_tables, lens, scale)
        o_proj(attn.reshape(rows, Q_DIM), out=x)
        down(cpu_kernels.silu_and_mul(gate_up(cpu_kernels.rms_norm(x, post, EPS))), out=x)


# 5 threads: more than CI's 2 cores, so a team thread waits at its barriers for one that is not running
@pytest.mark.parametrize("num_threads", [1, 2, 5])
@pytest.mark.parametrize("rows_spec", [[(5, 1), (0, 1), (17, 1)], [(40, 1), (0, 1), (50, 1)],
                                       [(7, 1), (0, 9), (2, 1), (12, 6)]],
                         ids=["decode", "long-decode", "decode-and-prompts"])
@pytest.mark.parametrize("layer_types", [LAYER_TYPES, PACKED_TYPES], ids=["mixed", "packed"])
def test_quantized_layers_are_bitwise_the_op_by_op_layers(rows_spec, num_threads, layer_types):
    layers = make_layers(layer_types=layer_types)
    slots, tables, row_tables, lens = step_rows(rows_spec)
    rows, scale = slots.numel(), HEAD_DIM ** -0.5
    gen = torch.Generator().manual_seed(2)
    pools = [tuple(torch.randn(65, 4, KV_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16) for _ in range(2))
             for _ in layers]
    cos, sin = (torch.randn(rows, HEAD_DIM, generator=gen).to(torch.bfloat16) for _ in range(2))
    x = torch.randn(rows, HIDDEN, generator=gen).to(torch.bfloat16)
    weights = [t for norms, linears in layers
               for t in (*norms, *(u for lin in linears for u in (lin.fused, lin.bias)))]
    types = [lin.type_id for _, linears in layers for lin in linears]
    want, want_pools = x.clone(), [(k.clone(), v.clone()) for k, v in pools]
    got = x.clone()
    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        with torch.inference_mode():
            op_by_op(want, layers, want_pools, cos, sin, slots, tables, row_tables, lens, scale)
            cpu_kernels.decoder_layers_bf16(got, weights, [k for k, _ in pools], [v for _, v in pools], cos, sin, slots,
                                            tables, row_tables, lens, HEADS, EPS, scale, linear_types=types)
    finally:
        torch.set_num_threads(before)
    assert not torch.equal(want, x)
    assert torch.equal(got, want)
    for (k, v), (wk, wv) in zip(pools, want_pools):
        assert torch.equal(k, wk) and torch.equal(v, wv)


def test_bad_linear_types_are_refused_with_the_reason():
    layers = make_layers()[:1]
    slots, tables, row_tables, lens = step_rows([(3, 1)])
    pools = [tuple(torch.zeros(65, 4, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16) for _ in range(2))]
    cos = sin = torch.zeros(1, HEAD_DIM, dtype=torch.bfloat16)
    weights = [t for norms, linears in layers for t in (*norms, *(u for lin in linears for u in (lin.fused, lin.bias)))]
    types = [lin.type_id for lin in layers[0][1]]

    def call(types):
        cpu_kernels.decoder_layers_bf16(torch.zeros(1, HIDDEN, dtype=torch.bfloat16), weights, [pools[0][0]],
                                        [pools[0][1]], cos, sin, slots, tables, row_tables, lens, HEADS, EPS, 1.0,
                                        linear_types=types)

    with torch.inference_mode():
        call(types)
        with pytest.raises(RuntimeError, match="4 types a layer"):
            call(types[:3])
        with pytest.raises(RuntimeError, match=r"linear_types\[1\] = 7"):
            call([types[0], 7, *types[2:]])
        with pytest.raises(RuntimeError, match=r"qkv must be a contiguous|ggml type 8 must be pack_linear_quant's pack"):
            call([QUANT_TYPES["Q8_0"].ggml_id, *types[1:]])  # Q4_K blocks read as Q8_0: refused as they are packed
        with pytest.raises(RuntimeError, match="qkv must be pack_linear_bf16's pack"):
            call([-1, *types[1:]])
