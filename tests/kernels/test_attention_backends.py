"""The attention backends (gpu_kernels/attention/): chosen once per engine by device and dtype; the same
greedy tokens on each (torch reference, C++ CPU kernels, Triton under its interpreter), chunked and
static batching included; every prompt chunk of a step in one attention call per layer; the Triton
backend's prefill goes to gpu_kernels/triton_prefill's kernel whenever that module is importable."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from batchtop.core_engine.config import preset
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.worker import model_runner
from batchtop.gpu_kernels import cpu_kernels, gather_kv, prefill_attention, triton_decode
from batchtop.gpu_kernels.attention import select_backend
from batchtop.gpu_kernels.attention.padded_sdpa import padded_prefill_attention
from batchtop.gpu_kernels.attention.triton_cuda import PREFILL_MODULE, TritonCuda
from tests.conftest import make_requests, run_all, tiny_config
from tests.kernels.test_padded_prefill import step_with_chunks
from tests.support.triton_interpreter import why_not_interpretable

THREE_LAYERS = dataclasses.replace(preset("tiny"), num_hidden_layers=3)
BACKEND_OF_PATH = {"cpu_kernel": "cpu_kernels", "torch_reference": "torch_reference",
                   "triton_interpreted": "triton_cuda"}


def on_path(m: pytest.MonkeyPatch, path: str) -> None:
    if path == "cpu_kernel" and not cpu_kernels.available():
        pytest.skip(f"the CPU kernels are not built: {cpu_kernels.why_unavailable()}")
    if path == "torch_reference":
        m.setattr(cpu_kernels, "usable", lambda dtype, head_dim: False)
    if path == "triton_interpreted":
        reason = why_not_interpretable()
        if reason:
            pytest.skip(reason)
        m.setenv("TRITON_INTERPRET", "1")


def tokens(path: str, config, requests) -> dict:
    with pytest.MonkeyPatch.context() as m:
        on_path(m, path)
        engine = Engine(config)
        assert engine.runner.attention_backend.name == BACKEND_OF_PATH[path]
        return run_all(engine, requests)[0]


def test_the_backend_follows_the_device_and_dtype():
    if triton_decode.available():
        assert select_backend(torch.device("cuda"), torch.bfloat16, 128).name == "triton_cuda"
    assert select_backend("cpu", torch.float16, 16).name == "torch_reference"  # no CPU kernel for fp16
    if cpu_kernels.available():
        assert select_backend("cpu", torch.float32, 16).name == "cpu_kernels"
        assert select_backend("cpu", torch.bfloat16, 512).name == "torch_reference"  # head_dim past the kernel's


@pytest.mark.parametrize("path", BACKEND_OF_PATH)
def test_the_runner_chooses_its_backend_once_and_every_step_uses_it(monkeypatch, path):
    on_path(monkeypatch, path)
    choices = []
    monkeypatch.setattr(model_runner, "select_backend", lambda *a: choices.append(a) or select_backend(*a))
    engine = Engine(tiny_config())
    backend = engine.runner.attention_backend
    seen = []
    forward = backend.forward
    monkeypatch.setattr(backend, "forward", lambda *a: seen.append(a[5].backend) or forward(*a))
    run_all(engine, make_requests(3, seed=2, prompt=(2, 9), output=(2, 4)))
    assert len(choices) == 1 and backend.name == BACKEND_OF_PATH[path]
    assert seen and all(b is backend for b in seen)


WORKLOADS = {  # (config overrides, requests)
    # prompts cut into chunks that continue cached blocks, several chunks a step, beside decode rows
    "chunked": (dict(max_num_seqs=4, max_num_batched_tokens=16), dict(n=5, seed=4, prompt=(3, 30), output=(3, 7))),
    # static batching: prompts left-padded with padding chunks whose K/V goes to the scratch block
    "static": (dict(mode="static", max_num_seqs=4), dict(n=5, seed=6, prompt=(2, 14), output=(2, 6))),
}


@pytest.mark.parametrize("path", ["cpu_kernel", "triton_interpreted"])
@pytest.mark.parametrize("workload", WORKLOADS)
def test_greedy_tokens_are_the_reference_tokens_on_every_backend(workload, path):
    overrides, spec = WORKLOADS[workload]
    config, requests = tiny_config(**overrides), make_requests(**spec)
    with pytest.MonkeyPatch.context() as m:
        on_path(m, path)  # skips here, before the reference runs, where the path cannot run
    reference = tokens("torch_reference", config, requests)
    assert len(reference) == len(requests) and len(set(reference.values())) == len(reference)
    assert tokens(path, config, requests) == reference


def spy_prefill(engine: Engine, monkeypatch) -> list[tuple[int, int]]:
    """(prompt chunks, prefill calls) of each forward."""
    backend, model = engine.runner.attention_backend, engine.runner.model
    calls = []
    prefill, forward = backend.prefill, model.forward
    monkeypatch.setattr(backend, "prefill", lambda *a: calls.append(1) or prefill(*a))

    def counted(input_ids, positions, batch, rows):
        before = len(calls)
        out = forward(input_ids, positions, batch, rows)
        per_forward.append((len(batch.prefills), len(calls) - before))
        return out

    per_forward: list[tuple[int, int]] = []
    monkeypatch.setattr(model, "forward", counted)
    return per_forward


def test_a_step_of_several_prompt_chunks_makes_one_prefill_call_per_layer(monkeypatch):
    on_path(monkeypatch, "torch_reference")
    engine = Engine(tiny_config(model=THREE_LAYERS, max_num_seqs=4, max_num_batched_tokens=16))
    per_forward = spy_prefill(engine, monkeypatch)
    sdpa_queries = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda q, *a, **kw: sdpa_queries.append(q.shape) or sdpa(q, *a, **kw))
    engine.load_workload(make_requests(4, seed=1, prompt=(3, 5), output=(2, 3)))
    engine.step()  # four whole prompts, no decode rows: attention is the prefill alone
    assert per_forward == [(4, 3)]
    assert len(sdpa_queries) == 3 and all(len(shape) == 4 and shape[0] == 4 for shape in sdpa_queries)
    run_all(engine, make_requests(5, seed=4, prefix="more", prompt=(3, 30), output=(3, 7)))
    assert any(chunks > 1 for chunks, _ in per_forward[1:])
    assert all(calls == (3 if chunks else 0) for chunks, calls in per_forward)


def test_the_triton_backend_prefills_through_the_varlen_kernel_when_its_module_imports(monkeypatch):
    """A stand-in for gpu_kernels/triton_prefill following its contract (q of every prefill row, the
    pool, block_tables, int32 query_start_loc, context_starts; the chunk's own K/V read from the pool):
    the backend finds it, calls it once a step instead of the SDPA call, and its answer is the step's."""
    calls = []

    def paged_prefill_attention_triton(q, k_cache, v_cache, block_tables, query_start_loc, context_starts, scale):
        calls.append(query_start_loc.dtype)
        out = torch.empty_like(q)
        starts = query_start_loc.tolist()
        for s, (lo, hi) in enumerate(zip(starts, starts[1:])):
            cached = int(context_starts[s])
            ck, cv = gather_kv(k_cache, v_cache, block_tables[s], cached + hi - lo)
            out[lo:hi] = prefill_attention(q[lo:hi], ck, cv, cached, scale)
        return out

    module = types.ModuleType(PREFILL_MODULE)
    module.paged_prefill_attention_triton = paged_prefill_attention_triton
    monkeypatch.setitem(sys.modules, PREFILL_MODULE, module)
    backend = TritonCuda()
    assert backend.prefill_kernel is paged_prefill_attention_triton
    q, k, v, k_cache, v_cache, chunks = step_with_chunks([(5, 3), (0, 9), (17, 4)], (4, 2), 4)
    plan = backend._plan(types.SimpleNamespace(kv_caches=[(k_cache, v_cache)], prefills=chunks))
    got = backend.prefill(q, k, v, k_cache, v_cache, plan, 0.25)
    assert calls == [torch.int32]
    torch.testing.assert_close(got, padded_prefill_attention(q, k, v, k_cache, v_cache, plan, 0.25))

    monkeypatch.setitem(sys.modules, PREFILL_MODULE, None)  # what importing a module that is not there raises
    assert TritonCuda().prefill_kernel is None  # absent or not importable: the SDPA call
