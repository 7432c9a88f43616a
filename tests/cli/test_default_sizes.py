"""What compare and calibrate run when given no sizes (tui/cli/defaults.py): sized to finish in a
minute or two on an idle 2-core CPU; a size given on the command line still wins."""

from __future__ import annotations

import json

from click.testing import CliRunner

from batchtop.tui.cli import main
from batchtop.tui.cli.defaults import COMPARE_REQUESTS

TINY = ["--model", "tiny", "--dtype", "float32"]


def invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_compare_runs_its_default_number_of_requests_unless_told(tmp_path):
    for extra, expected in (([], COMPARE_REQUESTS), (["--num-requests", "20"], 20)):
        out = tmp_path / f"c{expected}.json"
        result = invoke(["compare", "--simulate", "h200", *TINY, "--num-kv-blocks", "256", *extra, "-o", str(out)])
        assert result.exit_code == 0, result.output
        doc = json.loads(out.read_text())
        assert doc["static"]["requests"]["submitted"] == doc["continuous"]["requests"]["submitted"] == expected
        assert doc["speedup"] > 1


def test_calibrate_on_a_cpu_sweeps_up_to_its_16_slots(tmp_path):
    out = tmp_path / "cal.json"
    result = invoke(["calibrate", *TINY, "--device", "cpu", "--context", "16", "--steps", "2", "--rounds", "1",
                     "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "at batch 1, 4, 16, context 16" in result.stderr
    assert json.loads(out.read_text())["fitted_on"]["batches"] == [1, 4, 16]
