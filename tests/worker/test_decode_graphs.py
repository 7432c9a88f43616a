"""Decode steps by batch-size bucket: the padding a CUDA graph replay adds changes no real row.

The capture itself needs CUDA (tests/test_gpu.py); here the same bucketed, padded forward runs eagerly.
"""

from __future__ import annotations

import pytest

from batchtop.core_engine.worker.decode_graphs import bucket_for, bucket_sizes
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import SamplingParams
from batchtop.core_engine.worker.model_runner import ModelRunner
from tests.conftest import make_requests, run_all, tiny_config


def test_buckets_cover_every_batch_up_to_max_num_seqs_with_the_smallest_fit():
    assert bucket_sizes(16) == [1, 2, 4, 8, 16]
    assert bucket_sizes(40) == [1, 2, 4, 8, 16, 24, 32, 40]
    assert bucket_sizes(1) == [1] and bucket_sizes(3) == [1, 2, 3] and bucket_sizes(5) == [1, 2, 4, 8]
    sizes = bucket_sizes(20)
    assert sizes[-1] >= 20
    assert [bucket_for(n, sizes) for n in (1, 3, 5, 9, 17, 24)] == [1, 4, 8, 16, 24, 24]
    assert bucket_for(25, sizes) is None  # above the largest bucket: the step runs eagerly


@pytest.mark.parametrize("mode", ["continuous", "static"])
def test_padded_bucket_forwards_give_the_eager_tokens(mode):
    config = tiny_config(mode=mode, max_num_seqs=6, num_kv_blocks=64)
    requests = make_requests(9, seed=5, prompt=(2, 18), output=(3, 14))
    requests[1] = requests[1].__class__(requests[1].id, requests[1].prompt_token_ids, requests[1].max_tokens,
                                        sampling=SamplingParams(temperature=0.8, top_p=0.9, seed=2))
    eager, _, _ = run_all(Engine(config), requests)
    runner = ModelRunner(config, bucketed_decode=True)
    bucketed, _, _ = run_all(Engine(config, runner=runner), requests)
    assert runner.graphs is not None and runner.graphs.replays > 10
    assert bucketed == eager


def test_enforce_eager_and_a_cpu_build_no_graphs():
    assert ModelRunner(tiny_config()).graphs is None  # CPU: nothing to capture
    assert tiny_config(enforce_eager=True).enforce_eager
