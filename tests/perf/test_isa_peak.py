"""The ISA's peak beside the measured compute roof: cores x clock x FLOPs a cycle where the CPU and its
clock are known, "unknown" and why where not; a measured roof above it says the cores clock higher."""

from __future__ import annotations

import pytest

from batchtop.core_engine.perf import isa_peak as ip

ZEN4 = {"vendor_id": "AuthenticAMD", "cpu family": "25", "model": "17", "cpu MHz": "2596.0"}
FLAGS = frozenset({"avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni"})


@pytest.fixture
def zen4(monkeypatch, tmp_path):
    monkeypatch.setattr(ip, "_cpuinfo", lambda: dict(ZEN4))
    monkeypatch.setattr(ip, "cpu_flags", lambda: FLAGS)
    monkeypatch.setattr(ip, "CPUFREQ_MAX", tmp_path / "absent")
    monkeypatch.setattr(ip, "cores", lambda: 2)


def test_each_kernel_has_its_instructions_peak_on_a_known_cpu(zen4):
    bf16, int8, fp32 = ip.isa_peak("linear_bf16"), ip.isa_peak("linear_quant Q8_0"), ip.isa_peak("torch float32 GEMM")
    assert (bf16.instruction, int8.instruction, fp32.instruction) == ("bf16 VDPBF16PS", "int8 VNNI", "fp32 FMA")
    assert bf16.flops == pytest.approx(2 * 2.596e9 * 64) and int8.flops == 2 * bf16.flops == 4 * fp32.flops
    assert bf16.text() == "ISA peak 332 GFLOP/s (bf16 VDPBF16PS: 2 cores x 2.6 GHz x 64 FLOP/cycle)"
    assert bf16.as_dict()["source"].endswith("(clock from /proc/cpuinfo; boost not read; Zen 3/4: 2x256-bit FMA)")
    assert ip.highest(ip.isa_peaks(("linear_bf16", "linear_quant Q8_0"))) == int8
    assert bf16.beside(385e9) == "measured above it: the cores clock at 3 GHz or more"
    assert bf16.beside(300e9) is None


def test_an_unknown_cpu_or_clock_says_unknown_and_why(zen4, monkeypatch):
    monkeypatch.setattr(ip, "_cpuinfo", lambda: {"vendor_id": "SomeVendor", "cpu family": "1", "model": "1"})
    peak = ip.isa_peak("linear_bf16")
    assert peak.flops is None and peak.text() == "ISA peak unknown (bf16 VDPBF16PS: CPU model not known here)"
    monkeypatch.setattr(ip, "_cpuinfo", lambda: {k: v for k, v in ZEN4.items() if k != "cpu MHz"})
    assert ip.isa_peak("linear_bf16").how == "unknown: no clock in /sys or /proc/cpuinfo"
    assert ip.isa_peak("a kernel nobody knows").flops is None


def test_sysfs_max_clock_wins_over_proc_cpuinfo(zen4, monkeypatch, tmp_path):
    (tmp_path / "max").write_text("3700000\n")
    monkeypatch.setattr(ip, "CPUFREQ_MAX", tmp_path / "max")
    assert ip.clock_hz() == (3.7e9, "cpufreq max")
