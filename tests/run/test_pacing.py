"""The bundled trace is paced to the engine's measured capacity: Little's law on measured step costs."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.run import pacing
from batchtop.tui.cli import main
from tests.conftest import tiny_config

TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32"]


def test_the_pace_plays_the_trace_at_the_rate_the_engine_completes_requests_at_the_target_load(monkeypatch):
    seen = {}

    def measured(engine, requests, concurrency):
        seen["concurrency"] = concurrency
        return 400.0, 60  # generated tokens per second of step time, steps

    monkeypatch.setattr(pacing, "measure_throughput", measured)
    engine = Engine(tiny_config(max_num_seqs=10))
    # 11 requests over 10 s: 1 req/s recorded; 50 output tokens each
    requests = [Request(f"r{i}", (1,) * 20, 50, arrival_s=float(i)) for i in range(11)]
    p = pacing.pace(engine, requests, target=0.8)
    assert seen["concurrency"] == 8  # 80% of the slots kept in flight while measuring
    assert p.time_scale == pytest.approx(1.0 / (400.0 / 50))  # Little: 8 req/s keeps 8 in the system
    assert "for ~80% busy slots" in p.describe() and "400 tok/s measured with 8 requests in flight" in p.describe()
    assert [r.arrival_s for r in pacing.paced(requests, p.time_scale)][-1] == pytest.approx(10 * p.time_scale)


def test_the_probe_runs_real_steps_at_the_target_concurrency_and_leaves_the_engine_untouched():
    engine = Engine(tiny_config(max_num_seqs=4))
    requests = [Request(f"r{i}", tuple(range(1, 9)), 5 + i) for i in range(12)]
    tokens_per_s, steps = pacing.measure_throughput(engine, requests, 3)
    assert tokens_per_s > 0 and steps == 10  # measured over one mean lifetime (outputs 5..16: mean 10)
    assert engine.counters.steps == 0 and engine.allocator.num_free_blocks == engine.allocator.num_blocks


def test_the_probe_keeps_its_lengths_when_the_model_would_stop_at_eos():
    """A real model (a GGUF file, a model directory) stops at its EOS ids; the probe's requests must
    not, or the loop drains before it measures the target concurrency."""
    import dataclasses
    config = tiny_config(max_num_seqs=4)
    every_token_ends = dataclasses.replace(config.model, eos_token_ids=tuple(range(config.model.vocab_size)))
    engine = Engine(config.with_(model=every_token_ends))
    requests = [Request(f"r{i}", tuple(range(1, 9)), 12) for i in range(12)]
    tokens_per_s, steps = pacing.measure_throughput(engine, requests, 3)
    assert steps >= 8 and tokens_per_s > 0


def test_a_trace_that_arrives_all_at_once_has_no_pace():
    engine = Engine(tiny_config())
    assert pacing.pace(engine, [Request("a", (1,), 2), Request("b", (1,), 2)]) is None


@pytest.mark.parametrize("args,paced", [([], True), (["--time-scale", "0.01"], False)])
def test_the_bundled_trace_is_paced_unless_a_time_scale_is_given(tmp_path, args, paced):
    out = tmp_path / "m.json"
    result = CliRunner().invoke(main, ["--headless", *TINY, "--num-requests", "24", *args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    workload = json.loads(out.read_text())["workload"]
    assert ("pace" in workload) == paced
    if paced:
        assert "its recorded pace" in result.stderr and workload["time_scale"] != 1
    else:
        assert workload["time_scale"] == 0.01


def test_the_probe_computes_every_prompt_token_though_its_requests_share_one_prompt(monkeypatch):
    """Its requests all carry one prompt: with the engine's prefix cache on they would skip their prefill
    and measure a capacity the bundled trace's distinct prompts never reach."""
    probes = []

    class Spy(Engine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            probes.append(self)

    monkeypatch.setattr(pacing, "Engine", Spy)
    engine = Engine(tiny_config(max_num_seqs=4))
    assert engine.config.enable_prefix_caching
    pacing.measure_throughput(engine, [Request(f"r{i}", tuple(range(1, 41)), 6) for i in range(8)], 3)
    (probe,) = probes
    assert probe.counters.cached_tokens == 0 and probe.counters.prompt_tokens >= 3 * 40
