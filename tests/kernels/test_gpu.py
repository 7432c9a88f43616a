"""The same kernels and engine on CUDA; skipped on machines without a GPU (CI has none)."""

from __future__ import annotations

import pytest
import torch

from batchtop.core_engine.perf.device_peaks import datasheet_peaks
from batchtop.core_engine.engine.engine import Engine
from batchtop.gpu_kernels import paged_decode_attention
from tests.conftest import make_requests, run_all, tiny_config
from tests.kernels.test_paged_attention import HD, NH, scattered_pool

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


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


def test_the_triton_decode_kernel_on_cuda_matches_the_reference():
    from batchtop.gpu_kernels import triton_decode
    if not triton_decode.available():
        pytest.skip("triton is not installed")
    decode_on_cuda_matches_the_cpu_reference(triton_decode.paged_decode_attention_triton, [70, 33, 1], seed=2)


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
