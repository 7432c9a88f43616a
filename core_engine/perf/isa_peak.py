"""The ISA's compute peak, cores x clock x FLOPs a cycle, shown beside the measured compute roof.

The measured roof is the fastest GEMM kernel the engine runs (kernel_peaks.py); the ISA's peak says how
far that kernel is from the silicon. FLOPs a cycle per core are the two FMA pipes' fp32 FLOPs, times
what one lane of the kernel's instruction does in a cycle against an fp32 FMA: 2 for VDPBF16PS (two bf16
products a lane), 4 for VNNI's VPDPBUSD (four int8 products), 1 for bf16 unpacked to fp32 FMAs (AVX2).
The clock is cpufreq's maximum where sysfs has it, else /proc/cpuinfo's "cpu MHz" (under a hypervisor
the nominal clock: a core that boosts runs faster, and the measured roof can read above this peak).
Where the CPU, its clock or the kernel's instruction is not known, the peak is None and says why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from batchtop.core_engine.device import cpu_flags
from batchtop.core_engine.perf.kernel_peaks import BF16_GEMM, QUANT_GEMM

CPUFREQ_MAX = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")  # kHz
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True, slots=True)
class IsaPeak:
    """One kernel's instruction peak on the cores that run it; flops None where it cannot be known."""

    instruction: str  # "bf16 VDPBF16PS", "int8 VNNI", "fp32 FMA"
    flops: float | None
    how: str  # "2 cores x 2.6 GHz x 64 FLOP/cycle" or "unknown: why"
    hz: float | None = None  # the clock it was computed at
    basis: str = ""  # where the clock and the FLOPs a cycle came from: "clock from /proc/cpuinfo; Zen 3/4: ..."

    def text(self) -> str:
        if self.flops is None:
            return f"ISA peak unknown ({self.instruction}: {self.how.removeprefix('unknown: ')})"
        return f"ISA peak {self.flops / 1e9:.0f} GFLOP/s ({self.instruction}: {self.how})"

    def as_dict(self, measured: float | None = None) -> dict:
        out: dict = {"instruction": self.instruction, "value": self.flops,
                     "source": f"{self.how} ({self.basis})" if self.basis else self.how}
        if measured is not None and self.flops:
            out["measured_over_peak"] = measured / self.flops
            if (note := self.beside(measured)) is not None:
                out["note"] = note
        return out

    def beside(self, measured: float) -> str | None:
        """What a measured roof above this peak says: the cores run faster than the clock read."""
        if not self.flops or measured <= self.flops or self.hz is None:
            return None
        return f"measured above it: the cores clock at {measured / self.flops * self.hz / 1e9:.2g} GHz or more"

def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where it cannot be read)."""
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def fp32_fma_flops_per_cycle(info: dict[str, str], flags: frozenset[str]) -> tuple[int, str] | None:
    """(fp32 FLOPs a cycle per core of its FMA pipes, the core's name); None for a CPU not known here."""
    try:
        family, model = int(info.get("cpu family", "")), int(info.get("model", ""))
    except ValueError:
        return None
    vendor = info.get("vendor_id", "")
    if vendor == "AuthenticAMD" and family == 0x17:
        return (32, "Zen 2: 2x256-bit FMA") if model >= 0x30 else (16, "Zen: 2x128-bit FMA")
    if vendor == "AuthenticAMD" and family == 0x19:
        return 32, "Zen 3/4: 2x256-bit FMA"  # Zen 4 runs a 512-bit FMA on two 256-bit halves
    if vendor == "AuthenticAMD" and family == 0x1A:
        return 64, "Zen 5: 2x512-bit FMA"
    if vendor == "GenuineIntel" and family == 6 and "avx512f" in flags:
        return 64, "Intel AVX-512: 2x512-bit FMA (1 on some Xeon Silver)"
    if vendor == "GenuineIntel" and family == 6 and {"avx2", "fma"} <= flags:
        return 32, "Intel AVX2: 2x256-bit FMA"
    return None


def instruction(kernel: str, flags: frozenset[str]) -> tuple[str, int] | None:
    """(the instruction a GEMM kernel's inner loop runs, its FLOPs a lane-cycle over an fp32 FMA's)."""
    if kernel == BF16_GEMM or kernel == "torch bfloat16 GEMM":
        if "amx_bf16" in flags:
            return None  # AMX tiles: not a multiple of the FMA pipes
        if "avx512_bf16" in flags:
            return "bf16 VDPBF16PS", 2
        return ("bf16 as fp32 FMA", 1) if {"avx2", "fma"} <= flags else None
    if kernel == QUANT_GEMM:
        return ("int8 VNNI", 4) if "avx512_vnni" in flags else None
    if kernel == "torch float32 GEMM":
        return "fp32 FMA", 1
    return None


def clock_hz() -> tuple[float, str] | None:
    """(the cores' clock, where it was read); None where neither sysfs nor /proc/cpuinfo has one."""
    try:
        return int(CPUFREQ_MAX.read_text(encoding="ascii")) * 1e3, "cpufreq max"
    except (OSError, ValueError):
        pass
    try:
        return float(_cpuinfo()["cpu MHz"]) * 1e6, "/proc/cpuinfo; boost not read"
    except (KeyError, ValueError):
        return None


def cores() -> int:
    """Cores the roofs were measured on: torch's threads, at most the CPUs this process may run on."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = os.cpu_count() or 1
    return max(1, min(torch.get_num_threads(), allowed))


def isa_peak(kernel: str) -> IsaPeak:
    """The instruction peak of one GEMM kernel on this CPU's cores, or why it is unknown."""
    flags = cpu_flags()
    inst = instruction(kernel, flags)
    if inst is None:
        return IsaPeak(kernel, None, "unknown: no instruction peak known for this kernel on this CPU")
    name, per_lane = inst
    fma = fp32_fma_flops_per_cycle(_cpuinfo(), flags)
    if fma is None:
        return IsaPeak(name, None, "unknown: CPU model not known here")
    clock = clock_hz()
    if clock is None:
        return IsaPeak(name, None, "unknown: no clock in /sys or /proc/cpuinfo")
    (fma_flops, core), (hz, where), n = fma, clock, cores()
    per_cycle = fma_flops * per_lane
    return IsaPeak(name, n * hz * per_cycle, f"{n} core{'s' if n > 1 else ''} x {hz / 1e9:.2g} GHz x "
                   f"{per_cycle} FLOP/cycle", hz, f"clock from {where}; {core}")


def isa_peaks(kernels: tuple[str, ...]) -> dict[str, IsaPeak]:
    """Each kernel's instruction peak, the compute roof's kernels (kernel_peaks.compute_kernels)."""
    return {kernel: isa_peak(kernel) for kernel in kernels}


def highest(peaks: dict[str, IsaPeak]) -> IsaPeak | None:
    """The peak beside a compute roof that is the fastest kernel's: the highest known, else any unknown."""
    known = [p for p in peaks.values() if p.flops is not None]
    if known:
        return max(known, key=lambda p: p.flops)
    return next(iter(peaks.values()), None)


def isa_record(peaks: dict[str, IsaPeak]) -> dict[str, dict]:
    """The ISA peaks as a trace header keeps them: a replay shows the recording machine's, not its own."""
    return {kernel: {"instruction": p.instruction, "flops": p.flops, "how": p.how, "hz": p.hz, "basis": p.basis}
            for kernel, p in peaks.items()}


def isa_from_record(record: object) -> dict[str, IsaPeak]:
    """isa_record's dict back; {} for a header without it (older traces) or one that is not such a dict."""
    if not isinstance(record, dict):
        return {}
    try:
        return {str(kernel): IsaPeak(str(p["instruction"]), None if p["flops"] is None else float(p["flops"]),
                                     str(p["how"]), None if p.get("hz") is None else float(p["hz"]),
                                     str(p.get("basis", "")))
                for kernel, p in record.items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        return {}

