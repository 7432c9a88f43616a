"""The device's roofs: peak FLOP/s in the model dtype and peak memory bandwidth.

On CUDA they come from a datasheet table keyed by the NVML/torch device name (dense bf16 tensor-core
FLOP/s, HBM/GDDR bandwidth). On a CPU, and on a GPU the table does not know, they are measured once
with a short microbenchmark (a large copy and a square GEMM, each the best of several runs) and cached
on disk per machine. Where batchtop's own CPU bf16 kernels run, the compute roof is what their fastest
GEMM reaches (linear_bf16's, or linear_quant's int8 blocks) and the memory roof the higher of the
copy's and their GEMV's (kernel_peaks.py).

A cached roof only goes up: a measurement again keeps the better of each (best_of), and a step that
beats a roof raises it in the cache (raise_cached, from raised_roofs.py), so a figure measured in a busy
minute does not hold later runs below what the machine was seen to do.

A roof is cached under what was measured (roofs_identity: the device, its ISA, torch, threads, the
probes, and whether batchtop's kernels or torch's ops ran them, with the kernels' build), and a cached
file is served only to that identity: the roofs torch's ops reach while the kernels build (an AVX2
CPU's emulated bf16 GEMM: 306 MFLOP/s) are never served as the kernels' (99 GFLOP/s there).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from datetime import datetime, timezone
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from batchtop.core_engine.device import DTYPES, cpu_flags, cpu_has_native_bf16, device_name
from batchtop.core_engine.perf.roof_sources import with_raise
from batchtop.core_engine.perf.kernel_peaks import (KERNELS_SOURCE, best_time, kernel_peaks, kernels_for_roofs,
                                                    kernels_in_use)
from batchtop.gpu_kernels import huge_pages

T, G = 1e12, 1e9
GIB = 1 << 30
CACHED, BEST_OF_TWO = " (cached)", " (best of 2)"  # how a source says it was not measured just now

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

    def roofs_text(self, sep: str = ", ") -> str:
        """The two roofs as a person reads them: "306 MFLOP/s, 4.92 GB/s", "989 TFLOP/s, 4.8 TB/s"."""
        return f"{format_rate(self.peak_flops, 'FLOP/s')}{sep}{format_rate(self.peak_bytes_per_s, 'B/s')}"

    @property
    def with_batchtop_kernels(self) -> bool:
        """Measured on batchtop's CPU kernels (not torch's ops, not a datasheet)."""
        return KERNELS_SOURCE in self.source


def format_rate(value: float, unit: str) -> str:
    """Three significant digits and an SI prefix: 0.306e9 FLOP/s is "306 MFLOP/s", never "0 GFLOP/s"."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def best_of(a: DevicePeaks, b: DevicePeaks) -> DevicePeaks:
    """Each roof at the higher of two measurements of the same thing: a peak is the best the device was
    seen to do, and a measurement on a busy host reads low."""
    if a.peak_flops >= b.peak_flops and a.peak_bytes_per_s >= b.peak_bytes_per_s:
        return a
    if b.peak_flops >= a.peak_flops and b.peak_bytes_per_s >= a.peak_bytes_per_s:
        return b
    base = b.source.removesuffix(CACHED).removesuffix(BEST_OF_TWO)
    return DevicePeaks(b.device_name, max(a.peak_flops, b.peak_flops), max(a.peak_bytes_per_s, b.peak_bytes_per_s),
                       base + BEST_OF_TWO)


def datasheet_peaks(name: str) -> DevicePeaks | None:
    for fragment, flops, bandwidth, _ in DATASHEET:
        if fragment.lower() in name.lower():
            return DevicePeaks(name, flops, bandwidth, f"datasheet:{fragment}")
    return None


def _best_time(fn, device: str, repeats: int) -> float:
    """The fastest of `repeats` runs (kernel_peaks.best_time), synchronised on a GPU: a busy host's runs
    read slow, never fast, so the best is the nearest to what the device does."""
    if device != "cuda":
        return best_time(fn, repeats)
    return best_time(lambda: (fn(), torch.cuda.synchronize()), repeats)


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
    numel = copy_mib * (1 << 20) // 4
    if device == "cpu":  # on the pages the CPU kernels' weights are placed on (gpu_kernels/huge_pages.py)
        src, dst = huge_pages.empty((numel,), torch.float32).fill_(1), huge_pages.empty((numel,), torch.float32)
    else:
        src = torch.ones(numel, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
    copy_s = _best_time(lambda: dst.copy_(src), device, 7)
    bandwidth = 2 * src.numel() * 4 / copy_s
    del src, dst
    if kernels_in_use(device, dtype):
        # the step's GEMMs are batchtop's, so torch's is not timed: on an AVX2 CPU without AVX512_BF16 a
        # 2048^3 bf16 GEMM in torch takes about a minute, and batchtop's own runs it 300x faster
        kernels = kernel_peaks(gemm_n=gemm_n, gemv_mib=copy_mib)
        return DevicePeaks(device_name(device), kernels.flops, max(bandwidth, kernels.gemv_bytes_per_s),
                           f"measured:copy {copy_mib} MiB + {KERNELS_SOURCE} GEMM and GEMV {copy_mib} MiB "
                           f"(GEMMs {kernels.text()})")
    if device == "cpu" and dtype == "bfloat16" and not cpu_has_native_bf16():
        gemm_n = min(gemm_n, 256)  # emulated: 2048^3 takes about a minute (the dashboard waits for its roofs)
    a = torch.randn(gemm_n, gemm_n, device=device).to(DTYPES[dtype])
    b = torch.randn(gemm_n, gemm_n, device=device).to(DTYPES[dtype])
    gemm_s = _best_time(lambda: a @ b, device, 5)
    flops = 2 * gemm_n ** 3 / gemm_s
    return DevicePeaks(device_name(device), flops, bandwidth, f"measured:copy {copy_mib} MiB + {dtype} GEMM {gemm_n}^3")


def cache_dir() -> Path:
    root = os.environ.get("BATCHTOP_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "batchtop"


# What the probes measure, in the cache key: a roof cached by an older probe is measured again. 2: the
# GEMV streams the copy's 256 MiB, not 64 MiB that the last-level cache partly served (kernel_peaks.py).
# 3: the key holds the CPU's ISA and whether the kernels ran, and a file is served only to its identity.
# 4: each probe the best of its runs, not their median, and the compute roof the fastest GEMM kernel.
PROBES_VERSION = 4
ISA_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2", "fma")  # what decides a CPU's bf16 GEMM speed


def roofs_identity(device: str, dtype: str) -> dict:
    """What a measurement of the roofs depends on. Call kernels_for_roofs first: "kernels" says whether
    batchtop's CPU kernels (and which build) or torch's ops are what gets timed."""
    ident = {"device": device_name(device), "kind": device, "dtype": dtype, "torch": torch.__version__,
             "threads": torch.get_num_threads(), "probes": PROBES_VERSION,
             "isa": " ".join(f for f in ISA_FLAGS if f in cpu_flags()) if device == "cpu" else "",
             "kernels": "torch ops"}
    if kernels_in_use(device, dtype):  # measured apart, per build: the kernels' roofs are not torch's
        from batchtop.gpu_kernels.cpu_kernel_build import build_key
        ident["kernels"] = f"batchtop {build_key()}"
    return ident


def _cache_key(device: str, dtype: str, identity: dict | None = None) -> str:
    identity = identity or roofs_identity(device, dtype)
    return hashlib.sha1(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _read_cache(path: Path, identity: dict) -> DevicePeaks | None:
    """The cached roofs of exactly this identity; None for a missing, broken or foreign file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("identity") != identity:  # another kernel build, ISA or torch's ops: not these roofs
            return None
        flops, bandwidth = float(data["peak_flops"]), float(data["peak_bytes_per_s"])
        if not (0 < flops < math.inf and 0 < bandwidth < math.inf):  # NaN fails both
            return None
        return DevicePeaks(str(data["device_name"]), flops, bandwidth, str(data["source"]).removesuffix(CACHED))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # a broken cache is measured again


def roofs_file(device: str, dtype: str) -> tuple[Path, dict]:
    """Where the roofs of this device and dtype, as measured now, are cached, and the identity they are
    cached under (kernels_for_roofs first)."""
    identity = roofs_identity(device, dtype)
    return cache_dir() / f"peaks-{_cache_key(device, dtype, identity)}.json", identity


def _write_cache(path: Path, identity: dict, peaks: DevicePeaks) -> None:
    """Whole or not at all (a rename): two runs raising the same roofs never leave half a file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**asdict(peaks), "identity": identity}), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # a read-only home still gets the peaks, just not cached


def device_peaks(device: str, dtype: str, *, use_cache: bool = True, refresh: bool = False) -> DevicePeaks:
    """The roofs for this device: datasheet where known, else measured once and cached, on the kernels
    the steps will run (kernels_for_roofs). refresh: measure again even when cached, keeping each roof
    at the better of this and the cached measurement of the same identity (a step beat the roofs)."""
    if device == "cuda":
        known = datasheet_peaks(device_name(device))
        if known is not None:
            return known
    kernels_for_roofs(device, dtype)  # loads (or builds) batchtop's kernels where no background build runs
    path, identity = roofs_file(device, dtype)
    cached = _read_cache(path, identity) if use_cache else None
    if cached is not None and not refresh:
        return DevicePeaks(cached.device_name, cached.peak_flops, cached.peak_bytes_per_s, cached.source + CACHED)
    peaks = measure_peaks(device, dtype)
    if cached is not None:
        peaks = best_of(cached, peaks)
    if use_cache:
        _write_cache(path, identity, peaks)
    return peaks


def raise_cached(path: Path, identity: dict, flops: float, bytes_per_s: float) -> DevicePeaks | None:
    """Each cached roof raised to the given figure where that is higher (a step beat it), the source
    saying when; the file's roofs after, or None where no file of this identity exists to raise."""
    cached = _read_cache(path, identity)
    if cached is None:
        return None
    when = f"by a step on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    raised, source = cached, cached.source
    if flops > cached.peak_flops:
        raised, source = replace(raised, peak_flops=flops), with_raise(source, "compute", when)
    if bytes_per_s > cached.peak_bytes_per_s:
        raised, source = replace(raised, peak_bytes_per_s=bytes_per_s), with_raise(source, "memory", when)
    if raised is not cached:
        raised = replace(raised, source=source)
        _write_cache(path, identity, raised)
    return raised


def peaks_from_dict(data: dict | None) -> DevicePeaks | None:
    if not data:
        return None
    return DevicePeaks(data["device_name"], data["peak_flops"], data["peak_bytes_per_s"], data["source"])
