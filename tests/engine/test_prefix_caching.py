"""Prefix caching in the engine: hits counted as vLLM counts them, only the uncached rest computed,
and greedy outputs identical with caching on and off on every attention path (the CPU kernel, the
torch reference, the Triton decode kernel under its interpreter), after preemption and eviction too."""

from __future__ import annotations

import pytest
import torch

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.kv_cache import CACHED
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.model.packed_linear import packing
from batchtop.gpu_kernels import cpu_kernels, uses_cpu_kernel, uses_triton
from tests.conftest import run_all, tiny_config
from tests.support.triton_interpreter import interpret  # noqa: F401  (a fixture)

PREFIX = tuple(range(100, 112))  # three blocks of 4: a "system prompt"


def shared_workload() -> list[Request]:
    """Eight requests on one prefix with distinct tails (all arrive at once, so the first step admits
    several: the later ones find blocks the first one writes in that very step), two without it."""
    reqs = [Request(f"p{i}", PREFIX + tuple(200 + 7 * i + j for j in range(1 + i % 5)), 8 + i % 4)
            for i in range(8)]
    reqs += [Request(f"u{i}", tuple(300 + 11 * i + j for j in range(9)), 10) for i in range(2)]
    return reqs


def run(config_overrides: dict, requests: list[Request], engine_hook=None):
    engine = Engine(tiny_config(**config_overrides))
    if engine_hook is not None:
        engine_hook(engine)
    outputs, snaps, _ = run_all(engine, requests, check=lambda e, _: e.scheduler.check_invariants())
    return outputs, snaps, engine


def test_hit_counts_equal_a_hand_count_same_step_sharing_included():
    a = Request("a", PREFIX[:8] + (1, 2, 3), 5)  # 11 tokens: 2 full blocks
    b = Request("b", PREFIX[:8] + (4, 5), 3)  # admitted in a's step: finds a's 2 blocks, written in that step
    engine = Engine(tiny_config(max_num_seqs=4))
    _, snaps, _ = run_all(engine, [a, b])
    first = snaps[0]
    assert first.admitted == ("a", "b")
    assert {s.request_id: s.num_cached for s in first.slots if s.request_id} == {"a": 0, "b": 8}
    assert first.num_prefill_tokens == 11 + 2  # b computes only its tail
    assert first.block_refs.count(2) == 2  # the two prefix blocks are held by both
    c = Request("c", a.prompt_token_ids, 2)  # a's prompt again, after a finished: its 2 full blocks
    d = Request("d", PREFIX[:8], 2)  # 8 tokens, all cached: one must be computed, so 1 block hits
    _, snaps2, _ = run_all(engine, [c, d])
    counters = snaps2[-1].counters
    assert counters.prefix_queries == 11 + 10 + 11 + 8
    assert counters.prefix_hits == 0 + 8 + 8 + 4 == counters.cached_tokens
    # only what the cache lacked was computed: prompts less hits, then one decode row per output token
    # but the first (sampled from the prompt's last row)
    decode_rows = sum(r.max_tokens - 1 for r in (a, b, c, d))
    assert counters.computed_tokens == 40 - 20 + decode_rows


def test_the_kv_map_shows_shared_owned_cached_and_free_blocks():
    engine = Engine(tiny_config(max_num_seqs=4, num_kv_blocks=16))
    _, snaps, _ = run_all(engine, [Request("a", PREFIX + (1,), 3), Request("b", PREFIX + (2,), 3)])
    refs = snaps[0].block_refs
    assert refs.count(2) == 3 and refs.count(1) == 2 and refs.count(0) == 11  # 3 shared, 2 own tails
    end = snaps[-1].block_refs
    assert end.count(CACHED) == 3 and end.count(0) == 13  # the prefix stays cached, free but evictable
    assert snaps[-1].num_free_blocks == 16


def test_preempted_requests_find_their_own_blocks_again():
    # 14 blocks of 4 for eight prompts of up to 17 tokens growing by up to 11: decodes must preempt
    outputs, snaps, engine = run(dict(max_num_seqs=8, num_kv_blocks=14), shared_workload())
    c = engine.counters
    assert c.preemptions > 0
    assert c.cached_tokens > c.prefix_hits  # what readmitted requests found again is counted apart
    off, _, _ = run(dict(max_num_seqs=8, num_kv_blocks=14, enable_prefix_caching=False), shared_workload())
    assert outputs == off


def test_static_batches_share_a_prefix_within_the_batch_and_pad_only_the_computed_chunks():
    on, snaps, engine = run(dict(mode="static", max_num_seqs=4), shared_workload())
    first = snaps[0]
    cached = {s.request_id: s.num_cached for s in first.slots if s.request_id}
    assert cached == {"p0": 0, "p1": 12, "p2": 12, "p3": 12}
    longest = 13  # p0 computes its whole prompt (12 + 1), the others only their tails (2..4)
    assert first.num_prompt_padding_tokens == sum(longest - (n - 12) for n in (14, 15, 16))
    off, _, _ = run(dict(mode="static", max_num_seqs=4, enable_prefix_caching=False), shared_workload())
    assert on == off


@pytest.fixture
def torch_reference(monkeypatch):
    """Attention (and the fused elementwise ops) through the torch reference, not the CPU kernel."""
    monkeypatch.setattr(cpu_kernels, "usable", lambda dtype, head_dim: False)


@pytest.fixture
def triton_interpreted(interpret):
    """Decode rows through the Triton kernel under its interpreter (as test_triton_decode runs it);
    prompt chunks then take the torch reference."""


BF16 = pytest.mark.skipif(packing(torch.device("cpu"), torch.bfloat16) != "batchtop",
                          reason="bf16 is batch-invariant only on batchtop's CPU GEMMs (AVX512_BF16, or AVX2 and FMA)")
PATHS = ["cpu_kernel", "torch_reference", "triton_interpreted"]


def attention_path(request, path: str) -> None:
    if path != "cpu_kernel":
        request.getfixturevalue(path)
    device = torch.device("cpu")
    if path == "triton_interpreted":
        assert uses_triton(device)
    elif path == "cpu_kernel" and not cpu_kernels.available():
        pytest.skip(f"the CPU kernel is not built: {cpu_kernels.why_unavailable()}")
    else:
        assert uses_cpu_kernel(device, torch.float32, 16) == (path == "cpu_kernel")


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=BF16)])
@pytest.mark.parametrize("path", PATHS)
def test_greedy_outputs_are_identical_with_caching_on_and_off(request, path, dtype):
    attention_path(request, path)
    if dtype == "bfloat16" and path != "cpu_kernel":
        pytest.skip("bf16 parity is asserted on the CPU kernel path only")
    evictions = []

    def count_evictions(engine: Engine) -> None:
        forget = engine.allocator.cache.forget

        def counted(block: int) -> bool:
            evicted = forget(block)
            if evicted:
                evictions.append(block)
            return evicted

        engine.allocator.cache.forget = counted

    # roomy; chunked prefill (a prompt's blocks keyed chunk by chunk); a tight pool
    configs = [dict(max_num_seqs=4), dict(max_num_seqs=4, max_num_batched_tokens=8),
               dict(max_num_seqs=8, num_kv_blocks=14)]
    workload = shared_workload
    if path == "triton_interpreted":  # interpreted decode rows are slow: the kernel reads shared blocks in
        configs = configs[:1]  # the roomy run, on one slot-full of the prefix's requests and one without it;
        workload = lambda: shared_workload()[:4] + shared_workload()[-1:]  # noqa: E731  (eviction: the allocator's)
    for overrides in configs:
        overrides["dtype"] = dtype
        on, snaps, engine = run(overrides, workload(), count_evictions)
        off, _, off_engine = run({**overrides, "enable_prefix_caching": False}, workload())
        assert on == off, overrides
        assert len(set(on.values())) == len(on)  # outputs are request-specific: a mix-up would show
        c = engine.counters
        if "max_num_batched_tokens" not in overrides:  # same-step sharing: found in the step that wrote them
            assert snaps[0].counters.prefix_hits > 0
        assert c.prefix_hits > 0
        assert c.computed_tokens < off_engine.counters.computed_tokens
    if len(configs) > 1:
        assert engine.counters.preemptions > 0 and evictions  # the tight pool preempted and evicted


def test_a_simulated_run_charges_only_computed_tokens_so_a_cached_prefix_shortens_ttft():
    from batchtop.core_engine.config import preset
    from batchtop.core_engine.run.headless import run_workload
    from batchtop.core_engine.simulate.calibration import DEFAULT
    from batchtop.core_engine.simulate.simulated_devices import simulated_device
    from batchtop.core_engine.simulate.simulation import Simulation

    system = tuple(range(1, 513))  # a 512-token system prompt, then distinct 16-token questions
    requests = [Request(f"q{i}", system + tuple(600 + 16 * i + j for j in range(16)), 8, arrival_s=0.05 * i)
                for i in range(12)]
    device = simulated_device("l4")  # a prompt of 528 tokens is real work there, beside the step overhead
    sim = Simulation(device, device.peaks("bfloat16"), DEFAULT)
    ttft, computed = {}, {}
    for caching in (True, False):
        config = tiny_config(model=preset("cpu-demo"), dtype="bfloat16", block_size=16, num_kv_blocks=1024,
                             max_num_seqs=4, max_num_batched_tokens=2048, enable_prefix_caching=caching)
        engine = sim.engine(config)
        snaps = []
        assert run_workload(engine, requests, on_step=snaps.append).complete
        done = [f for s in snaps for f in s.finished]
        ttft[caching] = sorted(f.ttft_s for f in done)[len(done) // 2]
        computed[caching] = engine.counters.computed_tokens
    assert computed[False] - computed[True] == 11 * 512  # all but the first find the system prompt
    assert ttft[True] < 0.9 * ttft[False]  # the prefill step no longer computes the 512 shared tokens
