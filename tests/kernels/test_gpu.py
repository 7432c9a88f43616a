"""The same kernels and engine on CUDA; skipped on machines without a GPU (CI has none)."""

from __future__ import annotations

import pytest
import torch

from batchtop.core_engine.perf.device_peaks import datasheet_peaks
from batchtop.core_engine.engine.engine import Engine
from batchtop.gpu_kernels import paged_decode_attention
from tests.conftest import make_requests, run_all, tiny_config
from tests.kernels.test_paged_attention import HD, NH, scattered_pool

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def decode_on_cuda_matches_the_cpu_reference(kernel, lengths: list[int], seed: int) -> None:
    """One row per context length over one scattered pool of the longest: `kernel` on CUDA against
    the torch reference on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    k_cache, v_cache, table, _, _ = scattered_pool(max(lengths), 16, gen)
    tables = table[None, :].repeat(len(lengths), 1)
    lengths = torch.tensor(lengths)
    q = torch.randn(len(lengths), NH, HD, generator=gen)
    want = paged_decode_attention(q, k_cache, v_cache, tables, lengths, HD ** -0.5)
    got = kernel(*(t.cuda() for t in (q, k_cache, v_cache, tables, lengths)), HD ** -0.5)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)


def test_paged_decode_on_cuda_matches_the_cpu_reference():
    decode_on_cuda_matches_the_cpu_reference(paged_decode_attention, [40, 17, 1], seed=0)


@pytest.mark.parametrize("mode", ["continuous", "static"])
def test_an_engine_on_cuda_finishes_every_request_exactly_and_frees_every_block(mode):
    engine = Engine(tiny_config(device="cuda", mode=mode, max_num_seqs=8, num_kv_blocks=24))
    requests = make_requests(24, seed=3, prompt=(2, 30), output=(1, 20))
    outputs, _, _ = run_all(engine, requests, check=lambda e, _: e.scheduler.check_invariants())
    assert engine.runner.kv_caches[0][0].is_cuda
    assert {r.id: r.max_tokens for r in requests} == {k: len(v) for k, v in outputs.items()}
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks


def test_greedy_tokens_on_cuda_do_not_depend_on_the_batch():
    requests = make_requests(6, seed=11, prompt=(3, 20), output=(8, 16))
    batched, _, _ = run_all(Engine(tiny_config(device="cuda", max_num_seqs=6)), requests)
    alone = {}
    for r in requests:
        got, _, _ = run_all(Engine(tiny_config(device="cuda", max_num_seqs=1)), [r])
        alone.update(got)
    assert alone == batched


def test_this_gpu_has_datasheet_roofs_with_a_ridge_far_right_of_a_cpus():
    name = torch.cuda.get_device_name(0)
    peaks = datasheet_peaks(name)
    if peaks is None:
        pytest.skip(f"{name} is not in the datasheet table")
    assert peaks.ridge_flop_per_byte > 50  # batching stays nearly free into the hundreds on a GPU


@pytest.mark.parametrize("kernel", ["split_kv", "serial"])
def test_the_triton_decode_kernels_on_cuda_match_the_reference(kernel):
    from batchtop.gpu_kernels import triton_decode
    if not triton_decode.available():
        pytest.skip("triton is not installed")
    from batchtop.gpu_kernels.triton_decode_serial import paged_decode_attention_serial
    fn = triton_decode.paged_decode_attention_triton if kernel == "split_kv" else paged_decode_attention_serial
    decode_on_cuda_matches_the_cpu_reference(fn, [70, 33, 1], seed=2)


def bf16_pool(lengths: list[int], heads: int = 32, kv_heads: int = 8, head_dim: int = 128, block_size: int = 16,
              seed: int = 0):
    """A bf16 pool on the GPU at Llama-3-8B dims, each row's blocks shuffled, tables one block wider."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    need = [-(-n // block_size) for n in lengths]
    num_blocks = sum(need) + 1
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen, device="cuda").bfloat16()
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen, device="cuda").bfloat16()
    order = torch.randperm(num_blocks, generator=gen, device="cuda")
    tables = torch.full((len(lengths), max(need) + 1), int(order[-1]), device="cuda")
    start = 0
    for row, n in enumerate(need):
        tables[row, :n] = order[start:start + n]
        start += n
    q = torch.randn(len(lengths), heads, head_dim, generator=gen, device="cuda").bfloat16()
    return q, k, v, tables, torch.tensor(lengths, device="cuda")


def fp32_reference(q, k, v, tables, lens):
    return paged_decode_attention(q.float(), k.float(), v.float(), tables, lens, q.shape[-1] ** -0.5)


@pytest.mark.parametrize("lengths", [[256], [1], [4097], [256] * 64, [1 + 37 * i for i in range(64)]],
                         ids=["b1-256", "b1-1", "b1-4097", "b64-256", "b64-ragged"])
def test_split_kv_in_bf16_on_tensor_cores_matches_the_fp32_reference(lengths):
    from batchtop.gpu_kernels import triton_decode
    q, k, v, tables, lens = bf16_pool(lengths, seed=len(lengths))
    got = triton_decode.paged_decode_attention_triton(q, k, v, tables, lens, q.shape[-1] ** -0.5)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), fp32_reference(q, k, v, tables, lens), rtol=2e-2, atol=2e-2)


def test_split_kv_captured_once_in_a_cuda_graph_serves_any_context_length():
    from batchtop.gpu_kernels import triton_decode
    q, k, v, tables, lens = bf16_pool([700, 300, 64, 1], seed=9)
    captured_lens = torch.ones_like(lens)  # captured at length 1, as the engine's padding rows are
    scale = q.shape[-1] ** -0.5
    triton_decode.paged_decode_attention_triton(q, k, v, tables, captured_lens, scale)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = triton_decode.paged_decode_attention_triton(q, k, v, tables, captured_lens, scale)
    for new_lens in ([700, 300, 64, 1], [1, 640, 65, 129]):
        captured_lens.copy_(torch.tensor(new_lens))
        graph.replay()
        torch.testing.assert_close(out.float(), fp32_reference(q, k, v, tables, captured_lens), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("mode", ["continuous", "static"])
def test_cuda_graph_replays_give_the_eager_tokens(mode):
    from batchtop.core_engine.sched.request import SamplingParams
    requests = make_requests(10, seed=7, prompt=(2, 30), output=(4, 24))
    requests[0] = requests[0].__class__(requests[0].id, requests[0].prompt_token_ids, requests[0].max_tokens,
                                        sampling=SamplingParams(temperature=0.9, top_p=0.8, seed=5))
    graphed = Engine(tiny_config(device="cuda", mode=mode, max_num_seqs=6))
    eager = Engine(tiny_config(device="cuda", mode=mode, max_num_seqs=6, enforce_eager=True))
    assert graphed.runner.graphs is not None and eager.runner.graphs is None
    with_graphs, _, _ = run_all(graphed, requests)
    without, _, _ = run_all(eager, requests)
    assert graphed.runner.graphs.replays > 10
    assert with_graphs == without


def test_seeded_sampling_on_cuda_does_not_depend_on_the_batch():
    from batchtop.core_engine.sched.request import Request, SamplingParams
    target = Request("t", tuple(range(3, 15)), 20, sampling=SamplingParams(temperature=1.0, top_p=0.9, seed=11))
    alone, _, _ = run_all(Engine(tiny_config(device="cuda", max_num_seqs=1)), [target])
    crowd, _, _ = run_all(Engine(tiny_config(device="cuda", max_num_seqs=6)),
                          [*make_requests(5, seed=2, prompt=(2, 20), output=(5, 25)), target])
    assert alone["t"] == crowd["t"]


def test_a_decode_step_on_cuda_synchronises_once_for_its_sampled_tokens():
    import warnings

    from batchtop.core_engine.sched.request import Request, SamplingParams
    engine = Engine(tiny_config(device="cuda", max_num_seqs=4))
    engine.load_workload([Request(f"r{i}", tuple(range(1, 9)), 30,
                                  sampling=SamplingParams(temperature=0.9, top_p=0.8, seed=i) if i % 2 else SamplingParams())
                          for i in range(4)])
    for _ in range(3):  # prefill and a few steps: allocations, Triton compilation
        engine.step()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(5):
                assert engine.step().num_prefill_tokens == 0
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    assert 1 <= len(syncs) <= 5, [str(w.message) for w in syncs]
