"""docs/reliability.md's exit-code table, row by row, against what the commands do: each row is run
(the signal rows as processes, all at once, so the test costs one start-up), and a row without a
check here fails, so the table cannot gain a promise that nothing holds it to."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchtop.core_engine.worker.model_runner import ModelRunner
from batchtop.tui.cli import main
from tests.conftest import fail_on_call

DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32"]
RUN = ["--headless", *TINY, "--workload", "synthetic", "--rate", "0", "--time-scale", "0"]


def table() -> dict[int, str]:
    """code -> meaning, from the table under '## Exit codes'."""
    section = DOC.read_text(encoding="utf-8").split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\d+)` \| (.+?) \|$", section, re.MULTILINE)
    assert rows, "no exit-code table in docs/reliability.md"
    return {int(code): meaning for code, meaning in rows}


def headless(*args: str) -> int:
    return CliRunner().invoke(main, [*RUN, "--num-requests", "2", "-o", os.devnull, *args]).exit_code


def start(*args: str, ready: str) -> subprocess.Popen:
    """A batchtop process, read until its stderr says `ready` (it is past start-up, in the command)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "batchtop.tui", *args], stderr=subprocess.PIPE, text=True, env=env)
    proc.ready = ready  # type: ignore[attr-defined]
    return proc


def signalled(procs: dict[str, tuple[subprocess.Popen, int]]) -> dict[str, int]:
    """Each process sent its signal once it is ready; name -> exit code."""
    for proc, signum in procs.values():
        for line in proc.stderr:
            if proc.ready in line:
                break
        proc.send_signal(signum)
    for proc, _ in procs.values():
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # a full pipe would stall it
    return {name: proc.wait(timeout=60) for name, (proc, _) in procs.items()}


@pytest.fixture(scope="module")
def signal_codes() -> dict[str, int]:
    long_run = [*RUN, "--num-requests", "5000", "-o", os.devnull]
    serve = ["serve", "--headless", *TINY, "--port", "0"]
    procs = {
        "headless SIGINT": (start(*long_run, ready="requests"), signal.SIGINT),
        "headless SIGTERM": (start(*long_run, ready="requests"), signal.SIGTERM),
        "serve SIGINT": (start(*serve, ready="serving"), signal.SIGINT),
        "serve SIGTERM": (start(*serve, ready="serving"), signal.SIGTERM),
    }
    try:
        return signalled(procs)
    finally:
        for proc, _ in procs.values():
            proc.kill()


def test_every_row_of_the_exit_code_table_is_what_the_commands_do(signal_codes, monkeypatch):
    rows = table()
    checks = {
        0: lambda: {"a run that completes": headless()},
        2: lambda: {"--max-num-seqs 0": headless("--max-num-seqs", "0"),
                    "a missing workload file": headless("--workload", "/no/such.jsonl")},
        1: lambda: {"-o /dev/full (the write fails)": headless("-o", "/dev/full"),
                    "an engine failure": engine_failure(monkeypatch)},
        130: lambda: {"headless SIGINT": signal_codes["headless SIGINT"],
                      **({"serve SIGINT": signal_codes["serve SIGINT"]} if "serve" in rows[130] else {})},
        143: lambda: {"headless SIGTERM": signal_codes["headless SIGTERM"],
                      **({"serve SIGTERM": signal_codes["serve SIGTERM"]} if "serve" in rows[143] else {})},
    }
    assert set(rows) <= set(checks), f"rows with no check: {sorted(set(rows) - set(checks))}"
    expected_serve_sigint = 0 if "`batchtop serve` exits `0`" in rows[130] else 130
    for code, meaning in rows.items():
        for case, got in checks[code]().items():
            want = expected_serve_sigint if case == "serve SIGINT" else code
            assert got == want, f"row `{code}` ({meaning}): {case} exited {got}"


def engine_failure(monkeypatch) -> int:
    with monkeypatch.context() as patch:
        patch.setattr(ModelRunner, "run", fail_on_call(ModelRunner.run, 3, "simulated device fault"))
        return headless()
