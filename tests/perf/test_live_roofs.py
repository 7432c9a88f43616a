"""A live run's roofs follow what runs: measured again when the CPU kernels come in (the engine's own
switch-in step says so), and once when a step beats them by more than noise. Measurements injected."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.perf import live_roofs as lr
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.perf.live_roofs import LiveRoofs, fraction_of_roof
from batchtop.core_engine.worker.kernel_switch import KERNELS_IN, kernels_came_in
from batchtop.gpu_kernels import cpu_kernels
from tests.conftest import make_requests, tiny_config

TORCH = DevicePeaks("Test CPU", 306e6, 4.92e9, "measured:copy 256 MiB + bfloat16 GEMM 256^3")
KERNELS = DevicePeaks("Test CPU", 99e9, 11e9, "measured:copy 256 MiB + batchtop linear_bf16 GEMM and GEMV 256 MiB")


def step_at(fraction: float, peaks: DevicePeaks, controls=(), intensity: float = 16.0, weight_bytes=270e6):
    """A step snapshot whose achieved FLOP/s is `fraction` of its roof under `peaks`."""
    flops = 1e9
    cost = SimpleNamespace(flops=flops, bytes=flops / intensity, intensity=intensity, weight_bytes=weight_bytes)
    return SimpleNamespace(is_step=True, controls=controls, cost=cost, step=7, t=1.25,
                           forward_s=flops / (fraction * peaks.roof(intensity)))


class Measured:
    """The injected measurement: answers in turn, remembering whether each asked to refresh."""

    def __init__(self, *answers: DevicePeaks) -> None:
        self.answers, self.refreshes = list(answers), []

    def __call__(self, refresh: bool) -> DevicePeaks:
        self.refreshes.append(refresh)
        return self.answers.pop(0)


def test_the_roofs_are_measured_again_with_the_kernels_when_they_come_in():
    measured, seen = Measured(KERNELS), []
    roofs = LiveRoofs(TORCH, "cpu", "bfloat16", measure=measured, on_change=seen.append)
    roofs.observe(step_at(0.5, TORCH))
    assert measured.refreshes == []  # a step under its roof measures nothing
    roofs.observe(step_at(300.0, TORCH, controls=(KERNELS_IN,)))  # the first step on the kernels
    assert measured.refreshes == [False]  # their roofs: from the cache when measured before, else now
    assert [v.measuring for v in seen] == [True, False] and "re-measuring" in seen[0].note
    assert roofs.peaks == KERNELS
    assert roofs.view.note == "roofs re-measured with the C++ kernels: 99 GFLOP/s, 11 GB/s"


def test_a_step_above_the_roof_measures_it_again_once_keeping_the_better_of_each_roof():
    again = DevicePeaks("Test CPU", 120e9, 9e9, KERNELS.source)  # faster compute, on a busier memory bus
    measured = Measured(again)
    roofs = LiveRoofs(KERNELS, "cpu", "bfloat16", measure=measured)
    roofs.observe(step_at(1.1, KERNELS))  # within noise: not measured again, but raised to the step's figure
    assert measured.refreshes == []
    assert roofs.peaks.peak_flops == pytest.approx(1.1 * 99e9) and roofs.peaks.peak_bytes_per_s == 11e9
    roofs.observe(step_at(1.5, KERNELS))  # 1.36x the raised roof: measured again
    assert measured.refreshes == [True]
    assert roofs.view.note.startswith("a step ran at 1.4x the roof; re-measured: 120 GFLOP/s, 11 GB/s")
    # the step still beats the better of the two measurements, and raises the compute roof to its own figure
    assert "the step is still above them: raised to 148 GFLOP/s, 11 GB/s" in roofs.view.note
    assert (roofs.peaks.peak_flops, roofs.peaks.peak_bytes_per_s) == (pytest.approx(148.5e9), 11e9)
    roofs.observe(step_at(2.0, roofs.peaks))  # once: a step that still beats them raises them, unmeasured
    assert measured.refreshes == [True]
    assert roofs.peaks.peak_flops == pytest.approx(297e9) and fraction_of_roof(step_at(2.0, KERNELS), roofs.peaks) <= 1
    assert roofs.view.lines[0] == "raised compute by step 7 at t=1.2 s · memory by step 7 at t=1.2 s"


def test_a_step_that_still_beats_the_roof_says_so_and_why_when_its_weights_fit_in_the_cache(monkeypatch):
    monkeypatch.setattr(lr, "last_level_cache_bytes", lambda: 32 << 20)
    roofs = LiveRoofs(KERNELS, "cpu", "bfloat16", measure=Measured(KERNELS))
    roofs.observe(step_at(1.9, KERNELS, intensity=3.0, weight_bytes=25 << 20))
    assert "the step is still above them (its 25 MiB of weights fit in the 32 MiB cache): raised to" in roofs.view.note


def test_after_the_kernels_come_in_a_step_may_beat_the_new_roofs_once_more():
    measured = Measured(TORCH, KERNELS, KERNELS)
    roofs = LiveRoofs(TORCH, "cpu", "bfloat16", measure=measured)
    roofs.observe(step_at(1.5, TORCH))
    roofs.observe(step_at(300.0, TORCH, controls=(KERNELS_IN,)))
    roofs.observe(step_at(1.5, KERNELS))
    assert measured.refreshes == [True, False, True]


@pytest.mark.parametrize("peaks,applies", [(KERNELS, True), (None, False),
                                           (DevicePeaks("H200", 989e12, 4.8e12, "datasheet:H200"), False)])
def test_only_measured_roofs_are_measured_again(peaks, applies):
    assert LiveRoofs.applies(peaks) is applies


def test_the_engine_marks_the_step_its_background_kernels_came_in_before(monkeypatch):
    """The contract live_roofs reads: the engine's switch-in records KERNELS_IN on that step's snapshot."""
    engine = Engine(tiny_config())
    for request in make_requests(2, seed=1):
        engine.add_request(request)
    came_in = iter([True])
    monkeypatch.setattr(cpu_kernels, "switch_in", lambda: next(came_in, False))
    first, second = engine.step(), engine.step()
    assert kernels_came_in(first.controls) and not kernels_came_in(second.controls)
    assert fraction_of_roof(first, KERNELS) > 0


def test_a_measurement_that_fails_keeps_the_old_roofs_and_says_why_without_stopping_the_run():
    def broken(refresh: bool) -> DevicePeaks:
        raise RuntimeError("no memory for a 256 MiB probe")

    roofs = LiveRoofs(TORCH, "cpu", "bfloat16", measure=broken)
    roofs.observe(step_at(300.0, TORCH, controls=(KERNELS_IN,)))
    assert roofs.peaks == TORCH and not roofs.view.measuring
    assert roofs.view.note == "could not measure the roofs again: RuntimeError: no memory for a 256 MiB probe"
