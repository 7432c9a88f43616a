"""The roofs' cache is keyed by what was measured: a roof torch's ops reached (while the CPU kernels
built) is never served where batchtop's kernels run, nor one of another ISA; a measurement again keeps
the better of each roof; and the roofs always read in sensible units. The measurements are injected."""

from __future__ import annotations

import json

import pytest

from batchtop.core_engine.perf import device_peaks as dp
from batchtop.core_engine.perf.device_peaks import DevicePeaks, format_rate

TORCH = DevicePeaks("Test CPU", 306e6, 4.92e9, "measured:copy 16 MiB + bfloat16 GEMM 256^3")
KERNELS = DevicePeaks("Test CPU", 99e9, 11e9, f"measured:copy 16 MiB + {dp.KERNELS_SOURCE} GEMM and GEMV 16 MiB")


@pytest.fixture
def injected(tmp_path, monkeypatch):
    """Roofs measured by a fake that answers for whichever ops run now; `state["kernels"]` switches them."""
    monkeypatch.setenv("BATCHTOP_CACHE_DIR", str(tmp_path))
    state = {"kernels": False, "measured": []}
    monkeypatch.setattr(dp, "kernels_for_roofs", lambda device, dtype: state["kernels"])
    monkeypatch.setattr(dp, "kernels_in_use", lambda device, dtype: state["kernels"])

    def measure(device, dtype):
        peaks = KERNELS if state["kernels"] else TORCH
        state["measured"].append(peaks)
        return peaks

    monkeypatch.setattr(dp, "measure_peaks", measure)
    return state


def test_a_torch_op_roof_is_never_served_as_the_kernels_roof(injected, tmp_path):
    assert dp.device_peaks("cpu", "bfloat16") == TORCH  # the dashboard's first session: kernels building
    injected["kernels"] = True  # they came in (or attach, headless: they load before the roofs)
    with_kernels = dp.device_peaks("cpu", "bfloat16")
    assert with_kernels == KERNELS and injected["measured"] == [TORCH, KERNELS]
    assert dp.device_peaks("cpu", "bfloat16").peak_flops == 99e9  # now cached under the kernels' build
    files = {json.loads(p.read_text())["identity"]["kernels"] for p in tmp_path.glob("batchtop/peaks-*.json")}
    assert "torch ops" in files and any(kind.startswith("batchtop ") for kind in files)
    injected["kernels"] = False  # BATCHTOP_CPU_KERNEL=0: the torch roof, from its own file
    assert dp.device_peaks("cpu", "bfloat16").source == TORCH.source + " (cached)"
    assert len(injected["measured"]) == 2


def test_a_cached_file_is_served_only_to_the_identity_it_was_measured_for(injected, tmp_path, monkeypatch):
    dp.device_peaks("cpu", "bfloat16")
    (path,) = tmp_path.glob("batchtop/peaks-*.json")
    data = json.loads(path.read_text())
    data["identity"]["kernels"] = "batchtop 0123456789abcdef"  # a file that claims another measurement
    path.write_text(json.dumps(data))
    assert "(cached)" not in dp.device_peaks("cpu", "bfloat16").source
    assert len(injected["measured"]) == 2
    # the same CPU model name with another ISA (an AVX2 host sharing a home with an AVX512_BF16 one)
    monkeypatch.setattr(dp, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert "(cached)" not in dp.device_peaks("cpu", "bfloat16").source
    assert len(injected["measured"]) == 3


def test_measuring_again_keeps_each_roof_at_the_better_of_the_two_measurements(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHTOP_CACHE_DIR", str(tmp_path))
    busy = DevicePeaks("Test CPU", 80e9, 14e9, "measured:test")  # the compute roof on a busy host
    quiet = DevicePeaks("Test CPU", 99e9, 11e9, "measured:test")  # the bandwidth on a busy host
    runs = iter([busy, quiet])
    monkeypatch.setattr(dp, "measure_peaks", lambda device, dtype: next(runs))
    assert dp.device_peaks("cpu", "float32") == busy
    best = dp.device_peaks("cpu", "float32", refresh=True)
    assert (best.peak_flops, best.peak_bytes_per_s) == (99e9, 14e9) and best.source == "measured:test (best of 2)"
    cached = dp.device_peaks("cpu", "float32")
    assert (cached.peak_flops, cached.peak_bytes_per_s) == (99e9, 14e9) and cached.source.endswith("(cached)")


@pytest.mark.parametrize("value,unit,text", [
    (306e6, "FLOP/s", "306 MFLOP/s"), (4.92e9, "B/s", "4.92 GB/s"), (99.2e9, "FLOP/s", "99.2 GFLOP/s"),
    (989e12, "FLOP/s", "989 TFLOP/s"), (0.4e9, "FLOP/s", "400 MFLOP/s"), (512.0, "B/s", "512 B/s"),
])
def test_roofs_read_in_units_that_keep_three_digits(value, unit, text):
    assert format_rate(value, unit) == text


def test_the_roofs_text_never_reads_zero():
    assert TORCH.roofs_text() == "306 MFLOP/s, 4.92 GB/s"
    assert KERNELS.roofs_text(" · ") == "99 GFLOP/s · 11 GB/s"
    assert KERNELS.with_batchtop_kernels and not TORCH.with_batchtop_kernels
