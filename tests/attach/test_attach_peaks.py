"""attach against a server on this host's CPU places it against the roofs of batchtop's C++ kernels,
never the torch-op roofs a dashboard's first session cached while it built them; where the kernels
cannot run, the note says the roofs are torch's and why. The measurements are injected."""

from __future__ import annotations

import pytest

from batchtop.core_engine.attach import peaks as attach_peaks_module
from batchtop.core_engine.attach.peaks import attach_peaks
from batchtop.core_engine.perf import device_peaks as dp
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.gpu_kernels import cpu_kernels

LOCAL = ["http://127.0.0.1:8000"]
TORCH = DevicePeaks("Test CPU", 306e6, 4.92e9, "measured:copy 256 MiB + bfloat16 GEMM 256^3")
KERNELS = DevicePeaks("Test CPU", 99e9, 11e9, f"measured:copy 256 MiB + {dp.KERNELS_SOURCE} GEMM and GEMV 256 MiB")


@pytest.fixture
def host_cpu(tmp_path, monkeypatch):
    """No GPU here; `state["kernels"]`: whether batchtop's kernels load (they run when they do)."""
    monkeypatch.setenv("BATCHTOP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(attach_peaks_module, "_nvml_name", lambda: None)
    state = {"kernels": False}
    monkeypatch.setattr(dp, "kernels_for_roofs", lambda device, dtype: state["kernels"])
    monkeypatch.setattr(dp, "kernels_in_use", lambda device, dtype: state["kernels"])
    monkeypatch.setattr(dp, "measure_peaks", lambda device, dtype: KERNELS if state["kernels"] else TORCH)
    return state


def test_attach_on_this_cpu_never_reuses_the_torch_op_roofs_a_first_session_cached(host_cpu):
    dp.device_peaks("cpu", "bfloat16")  # the dashboard's first session, its kernels still building
    host_cpu["kernels"] = True
    peaks, note = attach_peaks(None, LOCAL, "bfloat16")
    assert peaks == KERNELS and note == f"this host's CPU (no GPU): {KERNELS.source}"
    peaks, note = attach_peaks("cpu", LOCAL, "bfloat16")  # --device cpu: the same roofs, now cached
    assert peaks.peak_flops == 99e9 and note.startswith("--device cpu: ") and "torch ops" not in note


def test_where_the_kernels_cannot_run_the_note_says_the_roofs_are_torchs_and_why(host_cpu, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "why_unavailable", lambda: "turned off by BATCHTOP_CPU_KERNEL=0")
    peaks, note = attach_peaks(None, LOCAL, "bfloat16")
    assert peaks == TORCH
    assert note.endswith("on torch ops (batchtop's C++ kernels: turned off by BATCHTOP_CPU_KERNEL=0)")
    assert "torch ops" not in attach_peaks(None, LOCAL, "float32")[1]  # fp32 GEMMs are torch's anyway
