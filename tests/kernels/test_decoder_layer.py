"""The fused decoder layer (one C++ call) computes bitwise what llama.DecoderLayer computes op by op on
the CPU kernels, K/V writes included; and the bf16 GEMM's epilogues (SiLU-and-mul from a weight packed
by halves, the residual add) and its column split across threads change no bit either."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from batchtop.core_engine.config import preset
from batchtop.core_engine.model.attention_batch import AttentionBatch, VarlenRows
from batchtop.core_engine.model.llama import (DecoderLayer, fusable_layers, LlamaForCausalLM, rope_cos_sin,
                                              rope_inv_freq)
from batchtop.core_engine.model.parameters import init_weights
from batchtop.core_engine.model.packed_linear import PackedLinear, packing
from batchtop.gpu_kernels import cpu_kernels
from tests.support.torch_threads import threads

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(packing(CPU, torch.bfloat16) != "batchtop" or not cpu_kernels.decoder_layer_usable(),
                                reason="needs batchtop's bf16 CPU kernels (AVX512_BF16, or AVX2 and FMA)")


def bf16_linear(k: int, n: int, bias: bool, halves: bool = False, seed: int = 0) -> PackedLinear:
    torch.manual_seed(seed)
    layer = PackedLinear(k, n, bias=bias, halves=halves).to(torch.bfloat16)
    if bias:
        with torch.no_grad():
            layer.bias.normal_()
    return layer


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 16, 40])
def test_silu_mul_epilogue_is_bitwise_the_separate_ops(rows, num_threads):
    """gate_up packed by halves with SiLU-and-mul as its epilogue == the plain GEMM, then silu_and_mul."""
    k, inter = 200, 96
    layer = bf16_linear(k, 2 * inter, bias=True, halves=True)
    x = torch.randn(rows, k).to(torch.bfloat16)
    plain = cpu_kernels.pack_linear_bf16(layer.weight.detach())
    with threads(num_threads), torch.inference_mode():
        fused = layer.silu_mul(x)
        separate = cpu_kernels.silu_and_mul(cpu_kernels.linear_bf16(x, plain, layer.bias, 2 * inter))
        gate, up = F.linear(x.float(), layer.weight.float(), layer.bias.float()).chunk(2, dim=-1)
    assert fused is not None and torch.equal(fused, separate)
    torch.testing.assert_close(fused.float(), F.silu(gate) * up, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("num_threads", [1, 2])
def test_a_weight_packed_by_halves_still_gives_every_column_its_own_row(num_threads):
    """The plain output of an interleaved pack: a one-hot weight picks out one input per column."""
    n, k = 128, 70
    pick = torch.randint(0, k, (n,), generator=torch.Generator().manual_seed(1))
    layer = bf16_linear(k, n, bias=False, halves=True)
    with torch.no_grad():
        layer.weight.zero_()
        layer.weight[torch.arange(n), pick] = 1
    x = torch.randn(9, k).to(torch.bfloat16)
    with threads(num_threads), torch.inference_mode():
        assert layer.half("batchtop") == n // 2 and torch.equal(layer(x), x[:, pick])


@pytest.mark.parametrize("n", [576, 130, 960])
def test_splitting_the_columns_between_threads_inside_a_group_changes_no_bit(n):
    """N = 576 is 9 groups of 64: two threads split it at 16-column blocks, one group between them."""
    layer = bf16_linear(320, n, bias=True, seed=n)
    x = torch.randn(16, 320).to(torch.bfloat16)
    with torch.inference_mode():
        with threads(1):
            one = layer(x)
        with threads(2):
            two = layer(x)
    assert torch.equal(one, two)
    torch.testing.assert_close(two.float(), F.linear(x.float(), layer.weight.float(), layer.bias.float()),
                               rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("epilogue", ["store", "silu_mul", "add_into"])
def test_a_rows_gemm_is_bitwise_the_same_alone_and_in_a_batch_of_any_size(epilogue):
    """A few rows stream the packed weights and many rows share an fp32 copy of them (on AVX2, from 16
    rows on); each row's output is still the one it gets alone, so a batch changes no token."""
    k, n = 200, 96
    layer = bf16_linear(k, 2 * n if epilogue == "silu_mul" else n, bias=True, halves=epilogue == "silu_mul")
    x = torch.randn(21, k).to(torch.bfloat16)
    residual = torch.randn(21, n).to(torch.bfloat16)

    def run(rows: slice) -> torch.Tensor:
        if epilogue == "silu_mul":
            return layer.silu_mul(x[rows])
        if epilogue == "add_into":
            out = residual[rows].clone()  # out += x W^T + b, the residual add as the GEMM's epilogue
            torch.ops.batchtop_cpu.linear_bf16(out, x[rows], layer.bf16_pack(), layer.bias, 0, 2)
            return out
        return layer(x[rows])

    with torch.inference_mode():
        alone = torch.cat([run(slice(r, r + 1)) for r in range(21)])
        for rows in (2, 3, 5, 8, 13, 16, 18, 19, 21):  # tiles of 2, and from 16 rows tiles of 4 and what is left
            assert torch.equal(run(slice(0, rows)), alone[:rows]), rows


def model_and_batch(config, rows_spec, seed: int = 0, layers: int = 1):
    """A bf16 model of `layers` layers with random weights, a pool with random cached K/V in each layer,
    and a step's batch: rows_spec is a list of (cached tokens, new tokens) per sequence; 1-token
    sequences are decode rows. -> (model, positions, cos, sin, batch)."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(dataclasses.replace(config, num_hidden_layers=layers)).to(torch.bfloat16)
    init_weights(model, seed, std=0.1)
    for name, param in model.named_parameters():  # biases and norms away from their trivial values
        if name.endswith("bias") or name.endswith("norm.weight"):
            with torch.no_grad():
                param.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.1)
    block, blocks = 4, 128
    shape = (blocks + 1, block, config.num_key_value_heads, config.head_dim)
    pools = [(torch.randn(shape).to(torch.bfloat16), torch.randn(shape).to(torch.bfloat16)) for _ in range(layers)]
    perm = torch.randperm(blocks)
    tables, row_tables, lens, slots, positions, used = [], [], [], [], [], 0
    width = max(-(-(c + n) // block) for c, n in rows_spec)
    for seq, (cached, new) in enumerate(rows_spec):
        table = perm[used:used + width].tolist()
        used += width
        tables.append(table)
        for p in range(cached, cached + new):
            row_tables.append(seq)
            lens.append(p + 1)
            slots.append(table[p // block] * block + p % block)
            positions.append(p)
    positions = torch.tensor(positions)
    cos, sin = rope_cos_sin(positions, rope_inv_freq(config), torch.bfloat16)
    batch = AttentionBatch(pools, torch.tensor(slots), 0, None, None, [],
                           varlen=VarlenRows(torch.tensor(tables), torch.tensor(row_tables), torch.tensor(lens)))
    return model, positions, cos, sin, batch


def layer_and_batch(config, rows_spec, seed: int = 0):
    """model_and_batch's one layer, and a random x for its rows."""
    model, positions, cos, sin, batch = model_and_batch(config, rows_spec, seed)
    x = torch.randn(positions.numel(), config.hidden_size).to(torch.bfloat16)
    return model.model.layers[0], x, cos, sin, batch


def fused(layer: DecoderLayer, x, cos, sin, batch, rows) -> None:
    """The layer through decoder_layers_bf16 (a stack of one), into x."""
    attn = layer.self_attn
    k_cache, v_cache = batch.kv_caches[attn.layer_idx]
    cpu_kernels.decoder_layers_bf16(x, list(layer.fused_weights()), [k_cache], [v_cache], cos, sin, batch.slot_mapping,
                                    *rows, attn.num_heads, layer.input_layernorm.variance_epsilon, attn.scale)


CONFIGS = {
    "tiny": preset("tiny"),
    "smollm2-like": dataclasses.replace(preset("tiny"), hidden_size=192, intermediate_size=512, head_dim=64,
                                        num_attention_heads=3, num_key_value_heads=1),
    "biases": dataclasses.replace(preset("tiny"), attention_bias=True, o_proj_bias=True, mlp_bias=True),
}


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("rows_spec", [[(5, 1), (0, 1), (17, 1), (3, 1)] * 4, [(7, 1), (0, 9), (2, 1), (12, 6)]],
                         ids=["decode-16", "decode-and-prompts"])
def test_the_fused_layer_is_bitwise_the_op_by_op_layer(config, rows_spec, num_threads):
    assert fusable_layers(config, CPU, torch.bfloat16)
    layer, x, cos, sin, batch = layer_and_batch(config, rows_spec)
    k_cache, v_cache = batch.kv_caches[0]
    pools = k_cache.clone(), v_cache.clone()
    got = x.clone()
    with threads(num_threads), torch.inference_mode():
        want = layer(x, cos, sin, batch)  # (its residual add writes into x)
        want_pool = k_cache.clone(), v_cache.clone()
        k_cache.copy_(pools[0]), v_cache.copy_(pools[1])
        varlen = batch.varlen
        fused(layer, got, cos, sin, batch, (varlen.tables, varlen.row_tables, varlen.context_lens))
    assert torch.equal(got, want)
    assert torch.equal(k_cache, want_pool[0]) and torch.equal(v_cache, want_pool[1])
    assert not torch.equal(k_cache, pools[0])  # the step's K/V really went into the pool


def test_the_fused_stack_is_bitwise_the_op_by_op_model_and_sees_weights_written_between_steps():
    """The model's layers in one call give the op-by-op logits bit for bit; the stack keeps every layer's
    packs between steps, and a weight written in place (a reload) or a parameter replaced in any layer
    must be what the next step computes with."""
    config = CONFIGS["biases"]
    model, positions, cos, sin, batch = model_and_batch(config, [(5, 1), (3, 1), (0, 4)], layers=3)
    input_ids = torch.randint(0, config.vocab_size, (positions.numel(),))
    rows = torch.arange(positions.numel())
    pools = [(k.clone(), v.clone()) for k, v in batch.kv_caches]

    def logits(fuse: bool) -> torch.Tensor:
        with torch.no_grad():
            for (k, v), (k0, v0) in zip(batch.kv_caches, pools):
                k.copy_(k0), v.copy_(v0)
        model.fuse_layers = fuse
        return model(input_ids, positions, batch, rows)

    before = logits(True)
    assert torch.equal(before, logits(False))
    with torch.no_grad():
        model.model.layers[2].mlp.down_proj.weight.mul_(2)  # in place, as load_state_dict writes
    written = logits(True)
    assert torch.equal(written, logits(False)) and not torch.equal(written, before)
    attn = model.model.layers[1].self_attn
    attn.qkv_proj.bias = torch.nn.Parameter(torch.zeros_like(attn.qkv_proj.bias))
    replaced = logits(True)
    assert torch.equal(replaced, logits(False)) and not torch.equal(replaced, written)


def test_a_bad_fused_layer_call_names_what_is_wrong():
    layer, x, cos, sin, batch = layer_and_batch(preset("tiny"), [(3, 1), (0, 1)])
    varlen = batch.varlen
    rows = (varlen.tables, varlen.row_tables, varlen.context_lens)
    with torch.inference_mode():
        with pytest.raises(RuntimeError, match="x must be a contiguous"):
            fused(layer, x.float(), cos, sin, batch, rows)
        with pytest.raises(RuntimeError, match="slot_mapping"):
            fused(layer, x, cos, sin, AttentionBatch(batch.kv_caches, batch.slot_mapping[:1], 0, None, None,
                                                            []), rows)
        with pytest.raises(RuntimeError, match="cos/sin"):
            fused(layer, x, cos[:1], sin[:1], batch, rows)


def test_a_decoder_stack_runs_on_the_steps_pool_and_rope_rows_and_says_what_stops_it():
    """A DecoderStack keeps the weights, not the pool: it runs a step on the pool it is given, each row
    roped with the table row its position names, bitwise the one-shot call on gathered rows. A position
    past the tables runs nothing and says so; a pool of other heads is named."""
    layer, x, cos, sin, batch = layer_and_batch(preset("tiny"), [(3, 1), (0, 1)])
    varlen = batch.varlen
    rows = (varlen.tables, varlen.row_tables, varlen.context_lens)
    attn = layer.self_attn
    k_cache, v_cache = batch.kv_caches[attn.layer_idx]
    n = x.shape[0]
    positions = torch.arange(n - 1, -1, -1)  # row r takes table row n - 1 - r
    tables = cos.flip(0).contiguous(), sin.flip(0).contiguous()
    with torch.inference_mode():
        stack = cpu_kernels.decoder_stack(list(layer.fused_weights()), attn.num_heads, attn.num_kv_heads,
                                          attn.head_dim, layer.input_layernorm.variance_epsilon, attn.scale,
                                          list(layer.fused_parameters()))
        want, got = x.clone(), x.clone()
        pools = [(k_cache.clone(), v_cache.clone()) for _ in range(2)]
        fused(layer, want, cos, sin, dataclasses.replace(batch, kv_caches=[pools[0]]), rows)
        ran = stack.run(got, [pools[1][0]], [pools[1][1]], *tables, positions, batch.slot_mapping, *rows)
        assert ran == cpu_kernels.STACK_RAN
        assert torch.equal(got, want) and not torch.equal(got, x)
        assert torch.equal(pools[1][0], pools[0][0]) and torch.equal(pools[1][1], pools[0][1])
        past = x.clone()
        ran = stack.run(past, [k_cache], [v_cache], cos, sin, positions + 1, batch.slot_mapping, *rows)
        assert ran == cpu_kernels.STACK_POSITIONS_PAST and torch.equal(past, x)
        narrow = [k_cache[..., :-2].contiguous()], [v_cache[..., :-2].contiguous()]
        with pytest.raises(RuntimeError, match="the stack's KV heads and head_dim"):
            stack.run(x.clone(), *narrow, cos, sin, positions, batch.slot_mapping, *rows)


def count_stack_runs(monkeypatch) -> list[int]:
    """A list that grows by one at every run of the models' DecoderStacks (the fused layers) from now on."""
    calls: list[int] = []
    make_stack = cpu_kernels.decoder_stack

    class CountedStack:
        def __init__(self, *args, **kwargs):
            self.stack = make_stack(*args, **kwargs)

        def run(self, *args):
            calls.append(1)
            return self.stack.run(*args)

    monkeypatch.setattr(cpu_kernels, "decoder_stack", CountedStack)
    return calls


def test_a_bf16_engine_runs_its_layers_fused_and_greedy_tokens_match_the_op_by_op_engine(monkeypatch):
    """The engine really takes the one-call path on this CPU (decode and mixed steps), and its greedy
    tokens are those of the same model run op by op."""
    from batchtop.core_engine.engine.engine import Engine
    from tests.conftest import make_requests, run_all, tiny_config

    requests = make_requests(6, seed=5, prompt=(3, 20), output=(6, 12))
    fused_engine = Engine(tiny_config(max_num_seqs=4, dtype="bfloat16"))
    calls = count_stack_runs(monkeypatch)
    fused, _, _ = run_all(fused_engine, requests)
    assert calls
    model = fused_engine.runner.model
    model.fuse_layers = False
    calls.clear()
    try:
        unfused, _, _ = run_all(Engine(tiny_config(max_num_seqs=4, dtype="bfloat16"), runner=fused_engine.runner),
                                requests)
    finally:
        model.fuse_layers = True
    assert not calls and fused == unfused


def test_kernels_switched_in_mid_run_bring_the_fused_layers_and_change_no_token(monkeypatch):
    """The dashboard starts on the torch ops while the kernels build in the background; once they come
    in between two steps, the next steps run the one-call layers, and the greedy tokens are those of a
    run that had the kernels from its first step."""
    from batchtop.core_engine.engine.engine import Engine
    from batchtop.core_engine.model.packed_linear import packing
    from tests.conftest import make_requests, run_all, tiny_config

    requests = make_requests(6, seed=7, prompt=(3, 20), output=(8, 14))
    config = tiny_config(max_num_seqs=4, dtype="bfloat16")
    from_start, _, _ = run_all(Engine(config), requests)

    calls = count_stack_runs(monkeypatch)
    monkeypatch.setattr(cpu_kernels, "_active", False)  # as while the background build runs
    packing.cache_clear()
    steps = iter(range(1000))

    def switch_in() -> bool:
        if next(steps) != 3:
            return False
        cpu_kernels._active = True
        return True

    monkeypatch.setattr(cpu_kernels, "switch_in", switch_in)
    try:
        engine = Engine(config)
        assert not fusable_layers(config.model, CPU, torch.bfloat16)
        switched, _, _ = run_all(engine, requests)
    finally:
        packing.cache_clear()
    assert calls, "the fused layers never ran after the kernels came in"
    assert switched == from_start
