"""The line a headless run (and the dashboard, before it draws) prints about its roofs reads in units
that keep three digits: an AVX2 CPU's torch-op roofs are "306 MFLOP/s", never "0 GFLOP/s"."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.tui.cli.headless import load_peaks


@pytest.mark.parametrize("flops,bandwidth,line", [
    (306e6, 4.92e9, "roofs: 306 MFLOP/s, 4.92 GB/s"),
    (99.2e9, 11.4e9, "roofs: 99.2 GFLOP/s, 11.4 GB/s"),
    (989e12, 4.8e12, "roofs: 989 TFLOP/s, 4.8 TB/s"),
])
def test_the_roofs_line_never_rounds_a_roof_to_zero(flops, bandwidth, line, capsys):
    peaks = DevicePeaks("Test CPU", flops, bandwidth, "measured:test")
    setup = SimpleNamespace(simulation=SimpleNamespace(peaks=peaks), config=SimpleNamespace(device="cpu"))
    assert load_peaks(setup) is peaks
    assert f"batchtop: {line} (measured:test)" in capsys.readouterr().err
