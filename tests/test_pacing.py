"""The bundled trace is paced to the engine's measured capacity: Little's law on measured step costs."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.engine.request import Request
from batchtop.core_engine.session import pacing
from batchtop.tui.cli import main
from tests.conftest import tiny_config

TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32"]


def test_the_pace_keeps_the_target_share_of_slots_busy_by_littles_law(monkeypatch):
    monkeypatch.setattr(pacing, "measure_step_costs", lambda engine, requests, batch: (0.020, 0.001))
    engine = Engine(tiny_config(max_num_seqs=10))
    # 11 requests over 10 s: 1 req/s recorded; 50 output and 20 prompt tokens each
    requests = [Request(f"r{i}", (1,) * 20, 50, arrival_s=float(i)) for i in range(11)]
    p = pacing.pace(engine, requests, target=0.8)
    rate = 0.8 * 10 / (50 * 0.020 + 0.8 * 10 * 0.001 * 20)  # 8 busy slots / seconds each holds one
    assert p.time_scale == pytest.approx(1.0 / rate) and p.batch == 8
    assert "for ~80% busy slots" in p.describe() and "decode step 20 ms at 8 sequences" in p.describe()
    assert [r.arrival_s for r in pacing.paced(requests, p.time_scale)][-1] == pytest.approx(10 * p.time_scale)


def test_measured_step_costs_come_from_real_steps_and_leave_the_engine_untouched():
    engine = Engine(tiny_config(max_num_seqs=4))
    requests = [Request(f"r{i}", tuple(range(1, 9)), 5) for i in range(4)]
    decode, per_token = pacing.measure_step_costs(engine, requests, 3)
    assert decode > 0 and per_token >= 0
    assert engine.counters.steps == 0 and engine.allocator.num_free_blocks == engine.allocator.num_blocks


def test_a_trace_that_arrives_all_at_once_has_no_pace():
    engine = Engine(tiny_config())
    assert pacing.pace(engine, [Request("a", (1,), 2), Request("b", (1,), 2)]) is None


@pytest.mark.parametrize("args,paced", [([], True), (["--time-scale", "1"], False)])
def test_the_bundled_trace_is_paced_unless_a_time_scale_is_given(tmp_path, args, paced):
    out = tmp_path / "m.json"
    result = CliRunner().invoke(main, ["--headless", *TINY, "--num-requests", "24", *args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    workload = json.loads(out.read_text())["workload"]
    assert ("pace" in workload) == paced
    if paced:
        assert "its recorded pace" in result.stderr and workload["time_scale"] != 1
    else:
        assert workload["time_scale"] == 1
