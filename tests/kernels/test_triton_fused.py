"""The fused Triton elementwise kernels of the decoder layer (gpu_kernels/triton_fused), run on the CPU under
Triton's interpreter, against the torch ops core_engine/model/llama.py defines them by; the engine's tokens on
them; and how many kernels one decoder layer launches with and without them."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from batchtop.core_engine.config import RopeScaling, preset
from batchtop.core_engine.model.llama import apply_rope, rope_cos_sin, rope_inv_freq
from batchtop.gpu_kernels import store_kv, triton_fused
from batchtop.gpu_kernels import triton_decode_kernels
from tests.support.triton_interpreter import interpret  # noqa: F401  (a fixture)

REAL_JIT = triton_decode_kernels.jit

def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """fp32: equal up to the last bits of exp, rsqrt and the rounding order. bf16: Triton's interpreter
    truncates fp32 to bf16 where the GPU rounds to nearest, so a value may sit a few bf16 steps from torch's
    here (the compiled kernels round as torch does); a wrong formula is off by far more."""
    assert got.dtype == want.dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    else:
        torch.testing.assert_close(got, want, rtol=2 ** -6, atol=2 ** -6 * want.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,inter", [(1, 64), (5, 1536), (3, 100)])
def test_silu_mul_matches_silu_of_gate_times_up(interpret, dtype, rows, inter):
    gen = torch.Generator().manual_seed(rows + inter)
    wide = (torch.randn(rows, 2 * inter + 8, generator=gen) * 4).to(dtype)
    gate_up = wide[:, :2 * inter]  # a view with a longer row stride
    gate, up = gate_up.chunk(2, dim=-1)
    close(triton_fused.silu_mul(gate_up), F.silu(gate) * up, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,hidden", [(1, 64), (7, 576), (2, 100)])
def test_add_rmsnorm_adds_into_the_residual_and_normalises_it_in_place(interpret, dtype, rows, hidden):
    gen = torch.Generator().manual_seed(rows * hidden)
    x = torch.randn(rows, hidden, generator=gen).to(dtype)
    residual = (torch.randn(rows, hidden, generator=gen) * 3).to(dtype)
    weight = (torch.rand(hidden, generator=gen) + 0.5).to(dtype)
    want_sum = residual + x
    want = F.rms_norm(want_sum, (hidden,), weight, 1e-5)
    got_residual, got = triton_fused.add_rmsnorm_(x, residual, weight, 1e-5)
    assert got_residual is residual and got is x  # in place: no allocation in the layer
    close(residual, want_sum, dtype)  # in fp32 exact; in bf16 one rounding (truncated by the interpreter)
    if dtype == torch.float32:
        assert torch.equal(residual, want_sum)
    close(x, want, dtype)


def test_add_rmsnorm_refuses_mismatched_shapes_by_name():
    with pytest.raises(ValueError, match="add_rmsnorm_: x \\(2, 8\\), residual \\(2, 4\\)"):
        triton_fused.add_rmsnorm_(torch.zeros(2, 8), torch.zeros(2, 4), torch.ones(8), 1e-5)


def scattered_slots(tokens: int, block_size: int, num_blocks: int, gen: torch.Generator) -> torch.Tensor:
    """Each token's slot in a shuffled set of blocks, the last tokens on the scratch block's first slot (the
    padding rows of a captured decode graph all write there)."""
    blocks = torch.randperm(num_blocks - 1, generator=gen)
    pos = torch.arange(tokens)
    slots = blocks[pos // block_size] * block_size + pos % block_size
    slots[-2:] = (num_blocks - 1) * block_size  # scratch
    return slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q_heads,kv_heads,head_dim,scaling", [
    (9, 3, 64, False), (4, 1, 128, True), (2, 2, 16, False)])
def test_rope_and_store_kv_matches_apply_rope_then_store_kv(interpret, dtype, q_heads, kv_heads, head_dim, scaling):
    scaled = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=512)
    config = replace(preset("tiny"), head_dim=head_dim, rope_theta=500000.0 if scaling else 10000.0,
                     rope_scaling=scaled if scaling else None)
    gen = torch.Generator().manual_seed(q_heads * head_dim)
    inv_freq = rope_inv_freq(config)
    table = triton_fused.cos_sin_table(inv_freq, 8193, torch.device("cpu"))
    positions = torch.tensor([0, 1, 17, 511, 4095, 8191, 8192, 3, 0])
    t, block_size, num_blocks = len(positions), 4, 6
    qkv = torch.randn(t, q_heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)  # the fused projection
    qk, v = qkv[:, :q_heads + kv_heads], qkv[:, q_heads + kv_heads:]
    slots = scattered_slots(t, block_size, num_blocks, gen)
    want_k_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=dtype)
    want_v_cache = torch.zeros_like(want_k_cache)
    cos, sin = rope_cos_sin(positions, inv_freq, dtype)
    want = apply_rope(qk.clone(), cos, sin)
    store_kv(want[:-2, q_heads:], v[:-2], want_k_cache, want_v_cache, slots[:-2])  # scratch: checked apart
    k_cache, v_cache = torch.zeros_like(want_k_cache), torch.zeros_like(want_v_cache)
    triton_fused.rope_and_store_kv(qk, v, table, positions, k_cache, v_cache, slots, q_heads)
    close(qk, want, dtype)
    real = torch.ones(num_blocks * block_size, dtype=torch.bool)
    real[-block_size:] = False
    close(k_cache.view(-1, kv_heads, head_dim)[real], want_k_cache.view(-1, kv_heads, head_dim)[real], dtype)
    assert torch.equal(v_cache.view(-1, kv_heads, head_dim)[real], want_v_cache.view(-1, kv_heads, head_dim)[real])
    scratch = k_cache.view(-1, kv_heads, head_dim)[slots[-1]]
    assert any(torch.equal(scratch, row) for row in qk[-2:, q_heads:])  # one padding row's k won the slot


def tiny_model_and_decode_batch(config, rows: list[int], seed: int = 0):
    """A float32 model with random weights (norms and biases away from their trivial values) and a decode
    step of one row per context length in `rows`, over shuffled blocks of a pool of random K/V."""
    from batchtop.core_engine.model.attention_batch import AttentionBatch
    from batchtop.core_engine.model.llama import LlamaForCausalLM
    from batchtop.core_engine.model.parameters import init_weights
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    init_weights(model, seed, std=0.1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or name.endswith("norm.weight"):
                param.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.1)
    block, width = 4, max(-(-n // 4) for n in rows)
    shape = (len(rows) * width + 1, block, config.num_key_value_heads, config.head_dim)
    pools = [(torch.randn(shape), torch.randn(shape)) for _ in range(config.num_hidden_layers)]
    tables = torch.randperm(shape[0] - 1)[:len(rows) * width].view(len(rows), width)
    positions = torch.tensor(rows) - 1
    slots = tables[torch.arange(len(rows)), positions // block] * block + positions % block

    def batch():  # chosen where it is built: Triton under the interpreter, else a CPU backend
        return AttentionBatch(pools, slots, len(rows), tables, torch.tensor(rows), [])
    return model, positions, batch


FUSED_CONFIGS = {
    "tiny": replace(preset("tiny")),
    "smollm2-like": replace(preset("tiny"), hidden_size=576 // 3, intermediate_size=256, head_dim=64,
                            num_attention_heads=3, num_key_value_heads=1),
    "qwen3-like": replace(preset("tiny"), qk_norm=True, attention_bias=True, mlp_bias=True, o_proj_bias=True,
                          rope_scaling=RopeScaling(8.0, 1.0, 4.0, 16)),
}


@pytest.mark.parametrize("config", FUSED_CONFIGS.values(), ids=FUSED_CONFIGS.keys())
def test_the_model_on_the_fused_kernels_gives_the_reference_logits_and_pool(interpret, config):
    from batchtop.core_engine.model import llama_triton
    model, positions, batch = tiny_model_and_decode_batch(config, [1, 6, 13, 30])
    ids = torch.tensor([3, 100, 7, 42])
    rows = torch.arange(4)
    fused_batch = batch()
    assert llama_triton.fused_on_triton(torch.zeros(1)) and fused_batch.backend.name == "triton_cuda"
    pools_before = [(k.clone(), v.clone()) for k, v in fused_batch.kv_caches]
    got = model(ids, positions, fused_batch, rows)
    pools_fused = [(k.clone(), v.clone()) for k, v in fused_batch.kv_caches]
    for (k, v), (k0, v0) in zip(fused_batch.kv_caches, pools_before):
        k.copy_(k0)
        v.copy_(v0)
    with pytest.MonkeyPatch.context() as m:
        m.delenv("TRITON_INTERPRET")
        assert not llama_triton.fused_on_triton(torch.zeros(1))
        want = model(ids, positions, batch(), rows)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for (k, v), (k1, v1) in zip(fused_batch.kv_caches, pools_fused):
        torch.testing.assert_close(k1, k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v1, v, rtol=1e-5, atol=1e-5)  # exact at layer 0; later inputs differ in ulps


def test_the_engine_on_the_fused_kernels_gives_the_reference_tokens(interpret, monkeypatch):
    from batchtop.core_engine.engine.engine import Engine
    from tests.conftest import make_requests, run_all, tiny_config
    calls = []
    real = triton_fused.rope_and_store_kv
    monkeypatch.setattr(triton_fused, "rope_and_store_kv", lambda *args: calls.append(1) or real(*args))
    requests = make_requests(4, seed=3, prompt=(3, 20), output=(4, 10))
    # chunked prefill too: decode rows and prompt chunks in one step
    fused, _, _ = run_all(Engine(tiny_config(max_num_seqs=4, max_num_batched_tokens=8)), requests)
    with pytest.MonkeyPatch.context() as m:
        m.delenv("TRITON_INTERPRET")
        fused_calls = len(calls)
        reference, _, _ = run_all(Engine(tiny_config(max_num_seqs=4, max_num_batched_tokens=8)), requests)
    assert fused_calls > 0 and len(calls) == fused_calls, "the fused kernels ran on the Triton path alone"
    assert fused == reference and all(len(tokens) for tokens in fused.values())


class KernelCount(TorchDispatchMode):
    """The kernels a block of code launches: every aten op that computes (views and bare allocations launch
    none) and every Triton launch (the ops Triton's interpreter runs inside one are not counted)."""

    FREE = {"empty", "empty_strided", "empty_like", "_unsafe_view", "lift_fresh", "detach", "alias"}

    def __init__(self) -> None:
        super().__init__()
        self.kernels: list[str] = []
        self.inside_triton = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.inside_triton and not func.is_view and name not in self.FREE:
            self.kernels.append(name)
        return func(*args, **(kwargs or {}))

    def jit(self, real_jit):
        def counted(fn):
            def at(grid):
                def launch(*args, **kwargs):
                    self.kernels.append(fn.__name__)
                    self.inside_triton = True
                    try:
                        return real_jit(fn)[grid](*args, **kwargs)
                    finally:
                        self.inside_triton = False
                return launch
            return type("Counted", (), {"__getitem__": lambda _, grid: at(grid)})()
        return counted


def test_a_decoder_layer_on_the_triton_path_launches_9_kernels_where_it_launched_17(interpret, monkeypatch):
    """One steady-state decode step of a middle layer, with what CUDA would run (no CPU kernels)."""
    from batchtop.core_engine.model import llama, llama_triton
    monkeypatch.setattr(llama, "fused_on_cpu", lambda *args: False)
    monkeypatch.setattr("batchtop.core_engine.model.packed_linear.packing", lambda *args: None)  # F.linear, as on CUDA
    config = preset("tiny")
    model, positions, batch = tiny_model_and_decode_batch(config, [5, 9])
    layer = model.model.layers[1]
    x, residual = torch.randn(2, config.hidden_size), torch.randn(2, config.hidden_size)
    cos, sin = rope_cos_sin(positions, rope_inv_freq(config), torch.float32)
    rope = llama_triton.RopeByPosition(llama_triton.rope_table(model, x.device), positions)
    counts = {}
    for path in ("op_by_op", "fused"):
        step = batch()
        step.backend.prepare(step)
        hidden, stream = x.clone(), residual.clone()
        mode = KernelCount()
        monkeypatch.setattr(triton_decode_kernels, "jit", mode.jit(REAL_JIT))
        with mode, torch.inference_mode():
            if path == "op_by_op":  # the layer's input is hidden + residual, summed by the layer before
                layer(x + residual, cos, sin, step)
            else:
                llama_triton.decoder_layer(layer, hidden, stream, rope, step)
        counts[path] = mode.kernels
    # op by op, 17: the previous layer's residual add and this RMSNorm apart, RoPE as three kernels (its cos/sin
    # tables rebuilt every step besides, outside the layer), the K/V write as two index copies, SiLU and mul
    # apart, the residual adds apart; the four GEMMs and attention (one split at this batch)
    assert counts["op_by_op"] == ["add", "rms_norm", "linear", "mul", "roll", "addcmul", "index_copy_", "index_copy_",
                                  "_split_kernel", "linear", "add", "rms_norm", "linear", "silu", "mul", "linear",
                                  "add"]
    # fused, 9: what remains is the four GEMMs and attention (with a merge kernel where it splits the keys)
    # between three fused kernels; a bias would ride in its GEMM (addmm)
    assert counts["fused"] == ["_add_rmsnorm_kernel", "linear", "_rope_store_kernel", "_split_kernel", "linear",
                               "_add_rmsnorm_kernel", "linear", "_silu_mul_kernel", "linear"]



@pytest.mark.slow  # a compile in a fresh process: a few seconds
def test_the_gpu_8b_fused_kernels_compile_for_sm90_without_spills(tmp_path):
    from tests.kernels.test_triton_offline_compile import compile_offline
    results = compile_offline(tmp_path, "--arch", "90", "--kernels", "fused")  # Llama-3-8B dims, bf16
    by_shape = {(r["rows"], r["kernel"]): r for r in results}
    assert set(by_shape) == {(rows, kernel) for rows in (1, 2048)
                             for kernel in ("_add_rmsnorm_kernel", "_rope_store_kernel", "_silu_mul_kernel")}
    assert by_shape[2048, "_rope_store_kernel"]["grid"] == [2048]  # one program a token: all 40 heads and the K/V
    for r in results:
        assert 0 < r["registers"] <= 255, r
        assert r["spill_stores"] == r["spill_loads"] == 0, r
