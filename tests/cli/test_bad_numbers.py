"""Numbers that are not numbers, or that no machine can honour, are refused by name before any work."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from batchtop.tui.cli import main

TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--workload", "synthetic", "--num-requests", "2"]


@pytest.mark.parametrize("args, option, says", [
    (["--time-scale", "inf"], "--time-scale", "not a finite number"),
    (["--time-scale", "nan"], "--time-scale", "not a finite number"),
    (["--time-scale", "-1"], "--time-scale", "must be >= 0"),
    (["--rate", "-5"], "--rate", "must be >= 0"),
    (["--rate", "nan"], "--rate", "not a finite number"),
    (["--rate", "inf"], "--rate", "not a finite number"),
    (["--prompt-scale", "inf"], "--prompt-scale", "not a finite number"),
    (["--output-scale", "inf"], "--output-scale", "not a finite number"),
    (["--length-scale", "0"], "--length-scale", "must be > 0"),
    (["--prompt-mean", "nan"], "--prompt-mean", "not a finite number"),
    (["--output-mean", "inf"], "--output-mean", "not a finite number"),
    (["--gpu-memory-utilization", "nan"], "--gpu-memory-utilization", "not a finite number"),
    (["--seed", "-1"], "--seed", "0<=x<=18446744073709551615"),
    (["--seed", str(2**64)], "--seed", "0<=x<=18446744073709551615"),
    (["--max-num-seqs", "4097"], "--max-num-seqs", "1<=x<=4096"),
    (["--num-kv-blocks", "1000000000"], "--num-kv-blocks", "GiB available"),
    (["--max-num-seqs", "32", "--max-num-batched-tokens", "16"], "--max-num-seqs", "32 is above max_num_batched_tokens 16"),
])
@pytest.mark.parametrize("command", [["--headless"], ["compare"]])
def test_a_bad_number_exits_2_naming_its_option_before_the_model_is_built(command, args, option, says):
    result = CliRunner().invoke(main, [*command, *TINY, *args])
    assert result.exit_code == 2, result.output
    assert option in result.output and says in result.output
    assert "building" not in result.output and "Traceback" not in result.output


def test_the_largest_seed_runs():
    result = CliRunner().invoke(main, ["--headless", *TINY, "--seed", str(2**64 - 1), "--prompt-mean", "4",
                                       "--output-mean", "4", "-o", "-"])
    assert result.exit_code == 0, result.output


def test_a_scripts_max_num_seqs_above_the_budget_is_refused_with_its_action(tmp_path):
    script = tmp_path / "s.json"
    script.write_text('[{"at": 0, "max_num_seqs": 8}, {"at": 1, "max_num_seqs": 600}]')
    result = CliRunner().invoke(main, ["--headless", *TINY, "--script", str(script)])
    assert result.exit_code == 2
    assert "--script" in result.output and "action 2: max_num_seqs 600 is above max_num_batched_tokens 256" in result.output
