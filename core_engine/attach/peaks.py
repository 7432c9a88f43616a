"""The roofs a live server is placed against: a datasheet GPU by --device NAME, the GPU NVML sees
when every replica runs on this host, or this host's CPU (measured once and cached) when it has none.
A remote server without --device gets no roofs: its point is drawn, the panel asks for the device.

This host's CPU is measured on batchtop's C++ kernels (loaded, or built once per machine, first), never
served the roofs torch's ops reached while a dashboard's first session built them: those are cached
under another identity (device_peaks.roofs_identity), and an AVX2 CPU's emulated bf16 GEMM reads 300x
below what the CPU does. Where the kernels cannot run, the note says the roofs are torch's and why.
"""

from __future__ import annotations

from batchtop.core_engine.attach.scrape.scrape import is_loopback, metrics_url
from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.perf.device_peaks import DevicePeaks, datasheet_peaks, device_peaks
from batchtop.core_engine.perf.telemetry import NvmlReader


def _nvml_name() -> str | None:
    reader = NvmlReader()
    try:
        reading = reader.read()
    finally:
        reader.close()
    return reading.get("device_name") if reading.get("available") else None


def attach_peaks(device: str | None, urls: list[str], dtype: str) -> tuple[DevicePeaks | None, str]:
    """(the roofs or None, where they come from or why there are none)."""
    if device:
        from batchtop.core_engine.simulate.simulated_devices import simulated_device
        try:
            chosen = simulated_device(device)
        except ConfigError as exc:
            raise ConfigError("device", str(exc).split(": ", 1)[-1]) from None
        peaks = chosen.peaks(dtype)
        torch_ops = _torch_ops_note(dtype, peaks) if chosen.datasheet is None else ""
        return peaks, f"--device {chosen.name}: {peaks.source}{torch_ops}"
    if not all(is_loopback(metrics_url(u)) for u in urls):
        return None, "remote server: give --device NAME (h100, a100, ...) for its roofs"
    name = _nvml_name()
    if name is not None:
        peaks = datasheet_peaks(name)
        if peaks is None:
            return None, f"NVML sees {name}, which the datasheet table lacks: give --device"
        return peaks, f"NVML on this host: {peaks.source}"
    peaks = device_peaks("cpu", dtype)
    return peaks, f"this host's CPU (no GPU): {peaks.source}{_torch_ops_note(dtype, peaks)}"


def _torch_ops_note(dtype: str, peaks: DevicePeaks) -> str:
    """Why a bf16 CPU roof was measured on torch's ops, not batchtop's kernels; "" where it was not."""
    if dtype != "bfloat16" or peaks.with_batchtop_kernels:
        return ""
    from batchtop.gpu_kernels import cpu_kernels
    return f" on torch ops (batchtop's C++ kernels: {cpu_kernels.why_unavailable() or 'no bf16 GEMM here'})"
