"""The device's roofs: peak FLOP/s in the model dtype and peak memory bandwidth.

On CUDA they come from a datasheet table keyed by the NVML/torch device name (dense bf16 tensor-core
FLOP/s, HBM/GDDR bandwidth). On a CPU, and on a GPU the table does not know, they are measured once
with a short microbenchmark (a large copy and a square GEMM) and cached on disk per machine. Where
batchtop's own CPU bf16 kernels run, the compute roof is what their GEMM reaches and the memory roof
the higher of the copy's and their GEMV's (kernel_peaks.py), so a step's fraction stays at most 1.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from batchtop.core_engine.device import DTYPES, cpu_has_native_bf16, device_name
from batchtop.core_engine.perf.kernel_peaks import kernel_peaks, kernels_in_use

T, G = 1e12, 1e9
GIB = 1 << 30

# name fragment -> (dense bf16 FLOP/s, bytes/s, memory); most specific fragments first. The memory is
# the datasheet's "GB", which on these cards is close to GiB (an "80GB" H100 reports 79.6 GiB to torch).
DATASHEET: tuple[tuple[str, float, float, int], ...] = (
    ("H200", 989 * T, 4800 * G, 141 * GIB),
    ("H100 NVL", 835 * T, 3900 * G, 94 * GIB),
    ("H100 PCIe", 756 * T, 2000 * G, 80 * GIB),
    ("H100", 989 * T, 3350 * G, 80 * GIB),  # SXM
    ("A100-SXM4-80GB", 312 * T, 2039 * G, 80 * GIB),
    ("A100 80GB PCIe", 312 * T, 1935 * G, 80 * GIB),
    ("A100-PCIE-40GB", 312 * T, 1555 * G, 40 * GIB),
    ("A100-SXM4-40GB", 312 * T, 1555 * G, 40 * GIB),
    ("A100", 312 * T, 1555 * G, 40 * GIB),
    ("L40S", 362 * T, 864 * G, 48 * GIB),
    ("L4", 121 * T, 300 * G, 24 * GIB),
    ("A10G", 125 * T, 600 * G, 24 * GIB),  # A10 datasheet figures
    ("RTX 4090", 165 * T, 1008 * G, 24 * GIB),  # bf16 with fp32 accumulate
    ("RTX 3090", 71 * T, 936 * G, 24 * GIB),
)


@dataclass(frozen=True, slots=True)
class DevicePeaks:
    device_name: str
    peak_flops: float
    peak_bytes_per_s: float
    source: str  # "datasheet:<entry>" or "measured:<how>"

    @property
    def ridge_flop_per_byte(self) -> float:
        """Arithmetic intensity where the memory roof meets the compute roof."""
        return self.peak_flops / self.peak_bytes_per_s

    def roof(self, intensity: float) -> float:
        """Attainable FLOP/s at this arithmetic intensity."""
        return min(self.peak_flops, self.peak_bytes_per_s * intensity)

    def as_dict(self) -> dict:
        return {**asdict(self), "ridge_flop_per_byte": self.ridge_flop_per_byte}


def datasheet_peaks(name: str) -> DevicePeaks | None:
    for fragment, flops, bandwidth, _ in DATASHEET:
        if fragment.lower() in name.lower():
            return DevicePeaks(name, flops, bandwidth, f"datasheet:{fragment}")
    return None


def _median_time(fn, device: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache sysfs lists for cpu0 (the L3 of its core complex on x86), or None."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text(encoding="ascii").strip()
            sizes.append(int(text.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(text[-1:], 0))
        except (OSError, ValueError):
            continue
    return max(sizes) if sizes else None


def probe_mib() -> int:
    """MiB the bandwidth probes stream: 256 (about a SmolLM2 step's weights), or 8x the last-level cache
    where that is more, so that no cache serves a probe's next pass (kernel_peaks.py)."""
    llc = last_level_cache_bytes() or 0
    return max(256, -(-8 * llc // (1 << 20)))


def measure_peaks(device: str, dtype: str, copy_mib: int | None = None, gemm_n: int = 2048) -> DevicePeaks:
    """STREAM-style copy bandwidth (bytes read + written) and square-GEMM FLOP/s in the model dtype."""
    copy_mib = copy_mib or probe_mib()
    src = torch.ones(copy_mib * (1 << 20) // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy_s = _median_time(lambda: dst.copy_(src), device, 7)
    bandwidth = 2 * src.numel() * 4 / copy_s
    del src, dst
    if kernels_in_use(device, dtype):
        # the step's GEMMs are batchtop's, so torch's is not timed: on an AVX2 CPU without AVX512_BF16 a
        # 2048^3 bf16 GEMM in torch takes about a minute, and batchtop's own runs it 300x faster
        flops, kernel_bandwidth = kernel_peaks(gemm_n=gemm_n, gemv_mib=copy_mib)
        return DevicePeaks(device_name(device), flops, max(bandwidth, kernel_bandwidth),
                           f"measured:copy {copy_mib} MiB + batchtop linear_bf16 GEMM and GEMV {copy_mib} MiB")
    if device == "cpu" and dtype == "bfloat16" and not cpu_has_native_bf16():
        gemm_n = min(gemm_n, 256)  # emulated: 2048^3 takes about a minute (the dashboard waits for its roofs)
    a = torch.randn(gemm_n, gemm_n, device=device).to(DTYPES[dtype])
    b = torch.randn(gemm_n, gemm_n, device=device).to(DTYPES[dtype])
    gemm_s = _median_time(lambda: a @ b, device, 5)
    flops = 2 * gemm_n ** 3 / gemm_s
    return DevicePeaks(device_name(device), flops, bandwidth, f"measured:copy {copy_mib} MiB + {dtype} GEMM {gemm_n}^3")


def cache_dir() -> Path:
    root = os.environ.get("BATCHTOP_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "batchtop"


# What the probes measure, in the cache key: a roof cached by an older probe is measured again. 2: the
# GEMV streams the copy's 256 MiB, not 64 MiB that the last-level cache partly served (kernel_peaks.py).
PROBES_VERSION = 2


def _cache_key(device: str, dtype: str) -> str:
    ident = f"{device_name(device)}|{device}|{dtype}|{torch.__version__}|{torch.get_num_threads()}|probes-{PROBES_VERSION}"
    if kernels_in_use(device, dtype):  # measured apart, per build: the kernels' roofs are not torch's
        from batchtop.gpu_kernels.cpu_kernel_build import build_key
        ident += f"|batchtop-kernels-{build_key()}"
    return hashlib.sha1(ident.encode()).hexdigest()[:16]


def device_peaks(device: str, dtype: str, *, use_cache: bool = True) -> DevicePeaks:
    """The roofs for this device: datasheet where known, else measured once and cached."""
    if device == "cuda":
        known = datasheet_peaks(device_name(device))
        if known is not None:
            return known
    path = cache_dir() / f"peaks-{_cache_key(device, dtype)}.json"
    if use_cache and path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            flops, bandwidth = float(data["peak_flops"]), float(data["peak_bytes_per_s"])
            if not (0 < flops < math.inf and 0 < bandwidth < math.inf):  # NaN fails both
                raise ValueError(f"unusable cached peaks {flops}, {bandwidth}")
            return DevicePeaks(str(data["device_name"]), flops, bandwidth, str(data["source"]) + " (cached)")
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a broken cache is measured again
    peaks = measure_peaks(device, dtype)
    if use_cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(asdict(peaks)), encoding="utf-8")
        except OSError:
            pass  # a read-only home still gets the peaks, just not cached
    return peaks


def peaks_from_dict(data: dict | None) -> DevicePeaks | None:
    if not data:
        return None
    return DevicePeaks(data["device_name"], data["peak_flops"], data["peak_bytes_per_s"], data["source"])
