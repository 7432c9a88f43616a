"""A roof only goes up: any step above it raises it (no noise margin), in the run and the cache; a
memory roof a cache-resident model beat stays in that run; each roof says where it came from."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from batchtop.core_engine.perf import raised_roofs as rr
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.perf.raised_roofs import RoofRaiser
from batchtop.core_engine.perf.roof_sources import roof_source, with_raise

MEASURED = DevicePeaks("Test CPU", 100e9, 10e9, "measured:copy 256 MiB + bfloat16 GEMM 2048^3 (cached)")


def step(flops_per_s: float, bytes_per_s: float, n: int = 3, weight_bytes: float = 270e6) -> SimpleNamespace:
    cost = SimpleNamespace(flops=flops_per_s * 0.01, bytes=bytes_per_s * 0.01, weight_bytes=weight_bytes)
    return SimpleNamespace(is_step=True, forward_s=0.01, cost=cost, step=n, t=0.5 * n)


def test_a_step_a_tenth_above_the_roof_raises_it_and_the_source_says_which_step():
    kept = []
    roofs = RoofRaiser(MEASURED, persist=lambda flops, bw: kept.append((flops, bw)))
    assert roofs.observe(step(90e9, 5e9)) is None and not roofs.raised  # under its roofs: nothing
    assert roofs.observe(step(110e9, 5e9, n=812)) == "step 812 beat the roofs: raised compute to 110 GFLOP/s"
    assert roofs.peaks.peak_flops == 110e9 and roofs.peaks.peak_bytes_per_s == 10e9
    assert roofs.compute.text() == f"{MEASURED.source} / raised by step 812 at t=406.0 s"
    assert roofs.memory.text() == MEASURED.source and kept == [(110e9, 5e9)]
    assert roofs.as_dict()["compute"] | {"source": None} == {
        "value": 110e9, "source": None, "measured": 100e9, "raised_by_step": 812, "raised_at_s": 406.0}


def test_a_memory_roof_beaten_by_weights_the_cache_holds_is_raised_in_the_run_only(monkeypatch):
    monkeypatch.setattr(rr, "last_level_cache_bytes", lambda: 32 << 20)
    kept = []
    roofs = RoofRaiser(MEASURED, persist=lambda flops, bw: kept.append((flops, bw)))
    roofs.observe(step(50e9, 30e9, weight_bytes=1 << 20))
    assert roofs.peaks.peak_bytes_per_s == 30e9 and kept == [(50e9, 0.0)]  # the cache keeps no memory raise
    roofs.observe(step(50e9, 40e9, weight_bytes=270e6))
    assert kept[-1] == (50e9, 40e9)


@pytest.mark.parametrize("peaks", [DevicePeaks("H200", 989e12, 4.8e12, "datasheet:H200"), None])
def test_only_measured_roofs_are_raised(peaks):
    assert not RoofRaiser.applies(peaks)
    if peaks is not None:
        roofs = RoofRaiser(peaks)
        assert roofs.observe(step(2e15, 9e12)) is None and roofs.peaks == peaks


def test_each_roof_reads_only_its_own_raise_back_from_a_cached_source():
    source = with_raise(with_raise("measured:copy (cached)", "compute", "by a step on 2026-12-07 23:40 UTC"),
                        "memory", "by a step on 2026-12-07 23:41 UTC")
    assert source.endswith(" (cached)") and with_raise(source, "compute", "x").count("compute raised") == 1
    assert roof_source(source, "compute") == "measured:copy (cached) / raised by a step on 2026-12-07 23:40 UTC"
    assert roof_source(source, "memory") == "measured:copy (cached) / raised by a step on 2026-12-07 23:41 UTC"
    assert roof_source("measured:copy", "memory") == "measured:copy"
