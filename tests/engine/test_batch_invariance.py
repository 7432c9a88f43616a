"""A sequence's output must not depend on who shares its batch (fp32, and bf16 on batchtop's own
CPU GEMMs; greedy)."""

from __future__ import annotations

import pytest
import torch

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.model.packed_linear import packing
from tests.conftest import make_requests, run_all, tiny_config

REQS = make_requests(8, seed=11, prompt=(3, 20), output=(8, 16))


def solo_outputs(runner, dtype: str = "float32") -> dict[str, tuple[int, ...]]:
    out = {}
    for r in REQS:
        engine = Engine(tiny_config(max_num_seqs=1, dtype=dtype), runner=runner)
        got, _, _ = run_all(engine, [r])
        out.update(got)
    return out


BF16_KERNEL = pytest.mark.skipif(packing(torch.device("cpu"), torch.bfloat16) != "batchtop",
                                 reason="bf16 GEMMs on batchtop's CPU kernel need AVX512_BF16")


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=BF16_KERNEL)])
def test_greedy_tokens_are_identical_alone_batched_static_continuous_and_after_preemption(dtype):
    base = Engine(tiny_config(dtype=dtype))
    solo = solo_outputs(base.runner, dtype)
    continuous, _, _ = run_all(Engine(tiny_config(max_num_seqs=8, dtype=dtype), runner=base.runner), REQS)
    static, _, _ = run_all(Engine(tiny_config(mode="static", max_num_seqs=8, dtype=dtype), runner=base.runner), REQS)
    tight_engine = Engine(tiny_config(max_num_seqs=8, num_kv_blocks=14, dtype=dtype))
    preempted, _, _ = run_all(tight_engine, REQS)
    assert tight_engine.counters.preemptions > 0
    assert solo == continuous == static == preempted
    assert len(set(solo.values())) == len(REQS)  # the model really produces request-specific outputs


def capture_logits(engine: Engine) -> dict[str, list[torch.Tensor]]:
    """Record each sequence's logits row at every sampling step."""
    seen: dict[str, list[torch.Tensor]] = {}
    sample = engine.runner.sampler.sample

    def recording(logits, seqs, *rest):
        for row, seq in zip(logits, seqs):
            seen.setdefault(seq.id, []).append(row.clone())
        return sample(logits, seqs, *rest)

    engine.runner.sampler.sample = recording
    return seen


def test_target_logits_are_bit_exact_when_only_the_neighbours_content_changes():
    target = Request("target", tuple(range(5, 17)), 10)
    neighbours_a = [Request(f"n{i}", tuple((7 * i + j) % 512 for j in range(9 + i)), 10) for i in range(3)]
    neighbours_b = [Request(r.id, tuple((t * 31 + 3) % 512 for t in r.prompt_token_ids), r.max_tokens)
                    for r in neighbours_a]
    runs = []
    for neighbours in (neighbours_a, neighbours_b):
        engine = Engine(tiny_config(max_num_seqs=4))
        logits = capture_logits(engine)
        run_all(engine, [target, *neighbours])
        runs.append(logits["target"])
    assert len(runs[0]) == len(runs[1]) == 10
    for a, b in zip(*runs):
        assert torch.equal(a, b)
