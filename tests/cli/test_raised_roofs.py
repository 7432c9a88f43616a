"""A roof measured in a busy minute never leaves a run's steps above it: a headless run whose cached
roofs read low raises them where its steps beat them, its metrics JSON says which step did, every
fraction in it is at most 1, and the next run starts from the raised compute roof."""

from __future__ import annotations

import json

from click.testing import CliRunner

from batchtop.core_engine.perf import device_peaks as dp
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.tui.cli import main

TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32"]
BUSY = DevicePeaks("Test CPU", 2e6, 1e5, "measured:copy 256 MiB + float32 GEMM 2048^3")  # far below any step


def test_a_step_that_beats_a_low_cached_roof_raises_it_so_no_fraction_in_the_json_is_above_1(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHTOP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(dp, "measure_peaks", lambda device, dtype: BUSY)
    out = tmp_path / "m.json"
    result = CliRunner().invoke(main, ["--headless", *TINY, "--num-requests", "4", "--time-scale", "0",
                                       "-o", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    roofline = json.loads(out.read_text())["roofline"]
    for kind in ("decode", "prefill"):
        assert roofline[kind]["steps"] > 0
        assert 0 < roofline[kind]["fraction_of_roof_mean"] <= roofline[kind]["fraction_of_roof_max"] <= 1.0, roofline
    compute = roofline["roofs"]["compute"]
    assert compute["measured"] == BUSY.peak_flops < compute["value"] == roofline["peak_flops"]
    assert isinstance(compute["raised_by_step"], int) and compute["raised_at_s"] >= 0
    assert compute["source"].startswith(BUSY.source + " / raised by step ")
    assert "isa_peak" in compute  # known (cores x clock x FLOPs a cycle) or saying why not
    assert "roofs raised by the steps that beat them" in result.stderr
    # the cache keeps the raised compute roof: the next run starts from it, saying where it came from
    cached = dp.device_peaks("cpu", "float32")
    assert cached.peak_flops == compute["value"] and "compute raised by a step on" in cached.source


def test_a_what_if_runs_roofs_are_the_models_and_never_raised(tmp_path):
    out = tmp_path / "m.json"
    result = CliRunner().invoke(main, ["--headless", "--model", "tiny", "--simulate", "h100", "--num-requests", "3",
                                       "--time-scale", "0", "-o", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    roofline = json.loads(out.read_text())["roofline"]
    assert roofline["peaks_source"].startswith("datasheet:") and "roofs" not in roofline
