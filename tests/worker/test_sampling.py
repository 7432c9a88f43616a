"""Batched device-side sampling: exact greedy, the nucleus distribution, seeds independent of the batch."""

from __future__ import annotations

import pytest
import torch

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request, SamplingParams
from batchtop.core_engine.worker.sampler import (Sampler, SamplingBatch, sample_nucleus_rejection,
                                                 sample_nucleus_sorted, uniforms)
from tests.conftest import make_requests, run_all, tiny_config
from tests.support.deadline import returns_within

V = 12


def rows_batch(n: int, top_p: float, seed: int = 5) -> SamplingBatch:
    """n rows of one request at n different positions: n independent draws from one stream."""
    return SamplingBatch(torch.ones(n), torch.full((n,), top_p), torch.full((n,), seed, dtype=torch.long),
                         torch.zeros(n, dtype=torch.long), torch.arange(n), True, top_p < 1.0)


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The definition, one token at a time: keep i when the mass strictly above p_i is < top_p."""
    keep = torch.tensor([probs[probs > p].sum() < top_p for p in probs])
    kept = torch.where(keep, probs, 0.0)
    return kept / kept.sum()


@pytest.mark.parametrize("method", [sample_nucleus_sorted, sample_nucleus_rejection])
@pytest.mark.parametrize("top_p", [0.5, 0.9, 1.0])
def test_top_p_draws_follow_the_renormalised_nucleus_and_never_leave_it(method, top_p):
    probs = torch.softmax(torch.linspace(2.0, -1.0, V) + torch.tensor([0.3, -0.3] * (V // 2)), dim=0)
    n = 20000
    tokens = method(probs.expand(n, V).contiguous(), torch.full((n,), top_p), rows_batch(n, top_p))
    want = nucleus(probs, top_p)
    got = torch.bincount(tokens, minlength=V).float() / n
    assert torch.all(got[want == 0] == 0)  # never outside the nucleus
    assert (got - want).abs().max() < 0.015  # 20k draws: ~4 standard errors at the largest p


def test_a_tie_at_the_nucleus_boundary_keeps_every_tied_token():
    probs = torch.tensor([0.4, 0.2, 0.2, 0.2])
    for method in (sample_nucleus_sorted, sample_nucleus_rejection):
        tokens = method(probs.expand(4000, 4).contiguous(), torch.full((4000,), 0.5), rows_batch(4000, 0.5))
        assert set(tokens.tolist()) == {0, 1, 2, 3}


def test_uniforms_are_a_function_of_seed_and_position_only():
    a = uniforms(rows_batch(1000, 1.0, seed=7), 0)
    b = uniforms(rows_batch(1000, 1.0, seed=7), 0)
    c = uniforms(rows_batch(1000, 1.0, seed=8), 0)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert 0.0 <= float(a.min()) and float(a.max()) < 1.0 and abs(float(a.mean()) - 0.5) < 0.03


def test_greedy_rows_in_a_mixed_batch_are_exactly_argmax():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)).bfloat16()
    batch = SamplingBatch(torch.tensor([0.0, 1.0, 0.0, 0.7, 0.0, 2.0]), torch.tensor([1.0, 0.9, 1.0, 1.0, 1.0, 0.5]),
                          torch.arange(6), torch.zeros(6, dtype=torch.long), torch.full((6,), 3), True, True)
    got = Sampler(0, "cpu").sample(logits, [], batch)
    greedy = torch.tensor([0, 2, 4])
    assert torch.equal(got[greedy], logits.argmax(-1)[greedy])


SAMPLED = SamplingParams(temperature=1.0, top_p=0.9, seed=1234)


def test_a_seeded_request_gives_the_same_tokens_alone_and_among_any_neighbours():
    target = Request("target", tuple(range(5, 17)), 24, sampling=SAMPLED)
    neighbours = [Request(r.id, r.prompt_token_ids, r.max_tokens,
                          sampling=SamplingParams(temperature=0.8, top_p=0.7 + 0.1 * i) if i % 2 else SamplingParams())
                  for i, r in enumerate(make_requests(5, seed=4, prompt=(3, 20), output=(8, 30)))]
    alone, _, _ = run_all(Engine(tiny_config(max_num_seqs=1)), [target])
    crowded, _, _ = run_all(Engine(tiny_config(max_num_seqs=6)), [*neighbours, target])
    static, _, _ = run_all(Engine(tiny_config(mode="static", max_num_seqs=6)), [target, *neighbours])
    assert alone["target"] == crowded["target"] == static["target"]
    assert len(set(alone["target"])) > 3  # really sampled, not a greedy loop


def test_different_seeds_give_different_tokens_and_greedy_is_unchanged_by_sampled_neighbours():
    a = Request("a", tuple(range(5, 17)), 24, sampling=SAMPLED)
    b = Request("b", a.prompt_token_ids, 24, sampling=SamplingParams(temperature=1.0, top_p=0.9, seed=99))
    g = Request("g", a.prompt_token_ids, 24)
    mixed, _, _ = run_all(Engine(tiny_config(max_num_seqs=3)), [a, b, g])
    greedy_alone, _, _ = run_all(Engine(tiny_config(max_num_seqs=1)), [g])
    assert mixed["a"] != mixed["b"]
    assert mixed["g"] == greedy_alone["g"]


# -- tiny values and bounded loops (issue 29: top_p 1e-300 froze the engine) ---------------------------

@pytest.mark.parametrize("method", [sample_nucleus_sorted, sample_nucleus_rejection])
def test_a_top_p_that_float32_rounds_to_zero_keeps_only_the_top_token(method):
    probs = torch.softmax(torch.randn(8, V, generator=torch.Generator().manual_seed(3)), dim=-1)
    top_p = torch.tensor([1e-300] * 8, dtype=torch.float32)  # 0.0 in float32
    assert float(top_p[0]) == 0.0
    got = returns_within(30, lambda: method(probs, top_p, rows_batch(8, 0.0)))
    assert torch.equal(got, probs.argmax(-1))


def test_rows_still_rejected_after_max_draws_are_drawn_from_the_nucleus_by_the_sort(monkeypatch):
    from batchtop.core_engine.worker import sampler

    monkeypatch.setattr(sampler, "MAX_DRAWS", 1)  # every rejected row goes to the sort
    probs = torch.softmax(torch.linspace(2.0, -1.0, V) + torch.tensor([0.3, -0.3] * (V // 2)), dim=0)
    n = 20000
    tokens = sample_nucleus_rejection(probs.expand(n, V).contiguous(), torch.full((n,), 0.5), rows_batch(n, 0.5))
    want = nucleus(probs, 0.5)
    got = torch.bincount(tokens, minlength=V).float() / n
    assert torch.all(got[want == 0] == 0)
    assert (got - want).abs().max() < 0.015


def test_nan_probabilities_still_end_the_rejection_loop():
    probs = torch.full((4, V), float("nan"))
    got = returns_within(30, lambda: sample_nucleus_rejection(probs, torch.full((4,), 0.5), rows_batch(4, 0.5)))
    assert got.shape == (4,) and bool(((got >= 0) & (got < V)).all())


def test_a_temperature_below_float32s_normal_range_is_greedy():
    assert SamplingParams(temperature=1e-40).greedy and SamplingParams(temperature=0.0).greedy
    assert not SamplingParams(temperature=1e-30).greedy


TINY_VALUES_SCRIPT = r"""
import json, sys
import torch
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request, SamplingParams
from batchtop.gpu_kernels import cpu_kernels
from tests.conftest import run_all, tiny_config

prompt = tuple(range(5, 17))
params = {"greedy": SamplingParams(), "top_p_zero": SamplingParams(temperature=1.0, top_p=1e-300, seed=1),
          "top_p_zero_b": SamplingParams(temperature=1.0, top_p=1e-300, seed=2),
          "cold": SamplingParams(temperature=1e-40, seed=1), "cold_b": SamplingParams(temperature=1e-40, seed=2)}
requests = [Request(name, prompt, 12, sampling=p) for name, p in params.items()]
outputs, _, _ = run_all(Engine(tiny_config(dtype="bfloat16", max_num_seqs=5)), requests)
kernel = {}
if cpu_kernels.available():  # the kernel on NaN logits: every row must still return
    logits = torch.randn(3, 600)
    logits[0, 7] = logits[1] = float("nan")
    b = [torch.ones(3), torch.full((3,), 0.5), torch.arange(3), torch.zeros(3, dtype=torch.long), torch.arange(3)]
    kernel["nan"] = cpu_kernels.sample(logits, *b).tolist()
print(json.dumps({"outputs": {k: list(v) for k, v in outputs.items()}, "kernel": kernel,
                  "used_kernel": cpu_kernels.available()}))
"""


@pytest.mark.parametrize("kernel", ["1", "0"])
def test_tiny_top_p_and_temperature_give_the_greedy_tokens_on_either_sampler(kernel):
    """A request with top_p that rounds to 0 in float32 (1e-300), or a temperature that underflows
    (1e-40), gets exactly the greedy tokens whatever its seed, on the CPU kernel and the torch code.
    In a child process: the old kernel never returned from such a row."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "BATCHTOP_CPU_KERNEL": kernel}
    proc = subprocess.run([sys.executable, "-c", TINY_VALUES_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    outputs = result["outputs"]
    assert result["used_kernel"] == (kernel == "1")
    for name in ("top_p_zero", "top_p_zero_b", "cold", "cold_b"):
        assert outputs[name] == outputs["greedy"], name
    if kernel == "1":
        assert all(0 <= t < 600 for t in result["kernel"]["nan"])
