"""The measured decode sweep takes one step of each point in turn; probes step between another engine's
steps without touching its cache."""

from __future__ import annotations

import pytest

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.perf import decode_sweep as sweep
from tests.conftest import make_requests, run_all, tiny_config

REQS = make_requests(6, seed=5, prompt=(3, 20), output=(8, 16))


def test_a_sweep_takes_one_step_of_each_point_in_turn_and_each_round_starts_over_from_its_context():
    samples = sweep.decode_sweep(Engine(tiny_config()), [1, 3], [20, 8], steps=2, rounds=2)
    assert [(s.batch, s.context) for s in samples[:4]] == [(1, 20), (3, 20), (1, 8), (3, 8)]
    assert len(samples) == 16 and all(s.seconds > 0 for s in samples)
    for point in range(4):
        mine = samples[point::4]  # its four steps: two in each round
        assert mine[1].cost.kv_bytes > mine[0].cost.kv_bytes  # a round's steps read one more token each
        assert [s.cost for s in mine[2:]] == [s.cost for s in mine[:2]]  # the second round, the same contexts


def test_a_context_longer_than_the_vocabulary_is_measured_and_a_short_sweep_is_an_error():
    # tiny has 512 token ids: a prompt of ids 1..600 would be refused, and measured nothing
    config = tiny_config(max_num_seqs=2, max_num_batched_tokens=2 * 600, block_size=16, num_kv_blocks=2 * 40)
    snaps = sweep.decode_steps(Engine(config), 2, 600, 3)
    assert len(snaps) == 3 and all(s.num_seqs == 2 for s in snaps)
    with pytest.raises(RuntimeError, match="2 sequences of 600 tokens decoded 0 steps together"):
        sweep.decode_steps(Engine(config.with_(num_kv_blocks=40)), 2, 600, 3)  # the pool holds one


def test_decode_steps_come_one_at_a_time_so_a_bench_can_measure_between_them():
    engine = Engine(tiny_config(max_num_seqs=2))
    stream = sweep.decode_step_stream(engine, 2, 12, 3)
    first = next(stream)
    assert engine.counters.steps == first.step  # no step ran past the one just handed over
    rest = list(stream)
    assert [s.step for s in rest] == [first.step + 1, first.step + 2]
    assert [s.step for s in sweep.decode_steps(Engine(tiny_config(max_num_seqs=2)), 2, 12, 3)] == \
        [first.step, *(s.step for s in rest)]


def test_probes_interleaved_with_a_run_measure_their_points_in_turn_and_leave_its_tokens_alone():
    config = tiny_config(max_num_seqs=8)
    alone, _, _ = run_all(Engine(config), REQS)
    engine = Engine(config)
    probes = sweep.DecodeProbes(engine, [1, 3], [8, 20], steps=40)
    probes.start()
    taken = []
    outputs, snaps, _ = run_all(engine, REQS, check=lambda e, snap: taken.append(probes.step()))
    assert outputs == alone  # each probe decodes in a KV pool of its own, on the same weights
    assert [(s.batch, s.context) for s in taken[:4]] == [(1, 8), (3, 8), (1, 20), (3, 20)]
    assert all(s.seconds > 0 and s.cost.flops > 0 for s in taken)
    longer = [s for s in taken if (s.batch, s.context) == (3, 20)]
    assert longer[1].cost.kv_bytes > longer[0].cost.kv_bytes  # each probe step reads one more token's keys
    probes.start()  # back to the points' own contexts
    assert probes.step().cost == taken[0].cost


def test_a_probe_starts_over_from_its_own_context_after_its_steps():
    probes = sweep.DecodeProbes(Engine(tiny_config()), [2], [8], steps=3)
    taken = [probes.step() for _ in range(7)]  # started on the first step
    assert [s.cost.kv_bytes for s in taken[:3]] == sorted({s.cost.kv_bytes for s in taken[:3]})
    assert taken[3].cost == taken[6].cost == taken[0].cost


def test_sweep_rows_never_share_their_kv_through_the_prefix_cache():
    """Rows reading one shared copy of their prompt's KV would time a cheaper decode than a real batch."""
    config = tiny_config(max_num_seqs=3, max_num_batched_tokens=3 * 64, block_size=16, num_kv_blocks=3 * 8)
    engine = Engine(config)
    assert config.enable_prefix_caching
    sweep.decode_steps(engine, 3, 64, 2)
    assert engine.counters.cached_tokens == 0
