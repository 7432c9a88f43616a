"""`batchtop --help`, every subcommand's --help and a usage error answer before torch (or numpy,
transformers, Textual, rich) is imported: they took 7-21 s on a loaded 2-core machine when the option
declarations imported the engine. Asserted on the modules loaded, not on time (times are noisy here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from batchtop.tui.cli import main

HEAVY = ("torch", "numpy", "transformers", "textual", "rich", "tokenizers", "safetensors", "triton")

# the console script's own entry point (tui/__main__.py), run as `batchtop ARGS` would run it
PROBE = """
import json, sys
sys.argv = ["batchtop", *json.loads(sys.argv[1])]
from batchtop.tui.__main__ import main
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "heavy": sorted(m for m in %r if m in sys.modules)}), file=sys.stderr)
""" % (HEAVY,)


def run_batchtop(*args: str) -> tuple[int, list[str], str]:
    """Exit code, the heavy modules loaded by then, and everything else on stderr."""
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True,
                         timeout=120)
    *rest, last = out.stderr.rstrip("\n").split("\n")
    result = json.loads(last)
    return result["code"], result["heavy"], out.stdout + "\n".join(rest)


@pytest.mark.parametrize("command", [None, *sorted(main.commands)])
def test_help_imports_nothing_heavy(command):
    code, heavy, text = run_batchtop(*([command] if command else []), "--help")
    assert code == 0 and "Usage: batchtop" in text
    assert heavy == []


@pytest.mark.parametrize("args, option", [(["--max-num-seqs", "x"], "--max-num-seqs"),
                                          (["compare", "--num-requests", "0"], "--num-requests"),
                                          (["calibrate", "--steps", "1"], "--steps"),
                                          (["--no-such-option"], "--no-such-option")])
def test_a_usage_error_names_the_option_and_imports_nothing_heavy(args, option):
    code, heavy, text = run_batchtop(*args)
    assert code == 2 and option in text
    assert heavy == []


def test_the_help_says_how_to_run_the_full_workloads():
    top, compare, calibrate = (" ".join(run_batchtop(*args, "--help")[2].split())  # unwrapped
                               for args in ([], ["compare"], ["calibrate"]))
    assert "--num-requests" in top.split("--headless", 1)[1]
    assert "--num-requests 256" in compare
    assert "--batches 1,8,32 sweeps further" in calibrate
