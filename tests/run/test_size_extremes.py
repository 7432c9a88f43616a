"""--num-kv-blocks and --max-num-seqs at 0, 1 and 10^9 (issue 52, round 4, "still to try"): 0 and 10^9
are exit 2 naming the option before anything is built (10^9 KV blocks: the terabytes it would take and
the memory there is, never an allocation); 1 runs in bounded memory: a pool of one block rejects what
cannot fit, with the numbers, and one slot runs the requests one at a time."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from batchtop.core_engine.worker.model_runner import ModelRunner
from batchtop.tui.cli import main
from tests.support.exits import assert_exit_2

TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32"]
RUN = ["--workload", "synthetic", "--num-requests", "4", "--time-scale", "0"]
COMMANDS = {"headless": ["--headless", *TINY, *RUN], "serve": ["serve", "--headless", *TINY, "--port", "0"]}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("option, value, says", [
    ("--num-kv-blocks", "0", "0 is not in the range x>=1"),
    ("--max-num-seqs", "0", "0 is not in the range 1<=x<=4096"),
    ("--num-kv-blocks", "1000000000", "1000000000 blocks of 16 tokens need 7629.39 GiB of KV cache"),
    ("--max-num-seqs", "1000000000", "1000000000 is not in the range 1<=x<=4096"),
])
def test_zero_and_a_billion_are_exit_2_naming_the_option_before_anything_is_built(command, option, value, says,
                                                                                  monkeypatch):
    monkeypatch.setattr(ModelRunner, "__init__", lambda *a, **k: pytest.fail("the engine was built"))
    result = CliRunner().invoke(main, [*COMMANDS[command], option, value])
    assert_exit_2(result, option, says)
    if value == "1000000000" and option == "--num-kv-blocks":
        assert "available" in result.output  # what the machine has, beside what it would need


def test_a_billion_kv_blocks_on_a_gpu_is_refused_against_its_memory(monkeypatch):
    """A GPU's pool is sized from its memory; one named on the command line is checked against it too."""
    monkeypatch.setattr(ModelRunner, "__init__", lambda *a, **k: pytest.fail("the engine was built"))
    result = CliRunner().invoke(main, ["--headless", "--simulate", "h100", "--model", "tiny", *RUN,
                                       "--num-kv-blocks", "1000000000"])
    assert_exit_2(result, "--num-kv-blocks: 1000000000 blocks of 16 tokens need 3814.70 GiB of KV cache",
                  "the simulated GPU has 80.00 GiB available")


def test_a_pool_of_one_block_rejects_each_request_with_its_numbers_and_exits_0(tmp_path):
    out = tmp_path / "m.json"
    result = CliRunner().invoke(main, [*COMMANDS["headless"], "--num-kv-blocks", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["complete"] and doc["requests"] == {"submitted": 4, "completed": 0, "rejected": 4}
    assert doc["kv"]["num_blocks"] == 1 and doc["kv"]["peak_used_blocks"] == 0
    assert result.output.count("KV blocks of 16 tokens, the pool has 1") == 4


def test_one_slot_runs_every_request_one_at_a_time(tmp_path):
    out = tmp_path / "m.json"
    result = CliRunner().invoke(main, [*COMMANDS["headless"], "--max-num-seqs", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["complete"] and doc["requests"]["completed"] == 4 and doc["batch_size"]["max"] == 1
