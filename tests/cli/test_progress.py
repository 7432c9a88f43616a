"""The headless progress line: requests done of the total with an ETA, every count monotonic, the last
line at the total (tui/cli/progress.py; the ETA itself: test_eta.py)."""

from __future__ import annotations

import dataclasses
import io
import re

from click.testing import CliRunner

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.run.headless import run_workload
from batchtop.tui.cli import main
from batchtop.tui.cli.progress import StderrProgress
from tests.conftest import make_requests, tiny_config

COUNTS = re.compile(r"(\d+)/(\d+) requests .* step (\d+) ")


class SlowClock:
    """Advances 20 ms per reading: a run of a few dozen steps lasts seconds, as a real one does."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.02
        return self.t


def lines_of_a_run(num: int = 12) -> list[str]:
    engine = Engine(tiny_config(max_num_seqs=4), clock=SlowClock())
    stream = io.StringIO()
    requests = make_requests(num, seed=3)
    progress = StderrProgress(requests, stream=stream, log_interval_s=0.0)  # a log: a line every step
    snaps = []

    def on_step(snap):
        snaps.append(snap)
        progress.update(snap)
        if len(snaps) == 5:  # an idle look between steps carries step 0 and no counts: nothing goes back
            progress.update(dataclasses.replace(snap, step=0, counters=dataclasses.replace(snap.counters, steps=0,
                                                                                            completed=0)))

    result = run_workload(engine, requests, on_step=on_step)
    assert result.complete
    progress.close()
    return stream.getvalue().splitlines()


def test_the_counts_only_grow_and_the_last_line_is_at_the_total():
    lines = lines_of_a_run()
    counts = [(int(m[1]), int(m[3])) for m in map(COUNTS.search, lines) if m]
    assert len(counts) == len(lines) > 10
    done, steps = zip(*counts)
    assert list(done) == sorted(done) and list(steps) == sorted(steps)
    assert lines[-1].startswith("batchtop: [########################] 12/12 requests · done in ")


def test_an_eta_comes_once_the_work_has_a_pace():
    lines = lines_of_a_run()
    assert "ETA after the first steps" in lines[0]
    assert any(re.search(r"ETA \d+s", line) for line in lines)


def test_a_plain_headless_run_counts_the_bundled_workloads_first_48_requests_and_says_so(tmp_path):
    out = tmp_path / "m.json"
    result = CliRunner().invoke(main, ["--headless", "--model", "tiny", "--device", "cpu", "--dtype", "float32",
                                       "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "first 48 requests (the --headless default" in result.stderr
    assert "48/48 requests · done in" in result.stderr.splitlines()[-1]


def test_a_tiny_model_says_how_many_parameters_it_has_not_0m(tmp_path):
    result = CliRunner().invoke(main, ["--headless", "--model", "tiny", "--device", "cpu", "--dtype", "float32",
                                       "--workload", "synthetic", "--num-requests", "2", "-o", str(tmp_path / "m.json")])
    assert result.exit_code == 0, result.output
    assert "building tiny (0.14M params" in result.stderr and "(0M params" not in result.stderr
