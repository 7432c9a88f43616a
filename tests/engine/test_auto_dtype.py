"""--dtype auto on a CPU: bf16 where it is faster than fp32 here, fp32 where it is not."""

import pytest

from batchtop.core_engine import device
from batchtop.gpu_kernels import cpu_kernels


@pytest.mark.parametrize("flags, kernels_build, expected", [
    ({"avx512f", "avx512_bf16", "avx2", "fma"}, False, "bfloat16"),  # native bf16 dot products
    ({"avx2", "fma"}, True, "bfloat16"),  # Zen 2/3: batchtop's AVX2 bf16 GEMMs, half fp32's bytes
    ({"avx2", "fma"}, False, "float32"),  # no compiler: torch's bf16 there is slower than fp32
    ({"avx2"}, True, "float32"),  # no FMA, no AVX2 kernel
    ({"sse4_2"}, True, "float32"),
])
def test_auto_picks_bf16_only_where_the_cpu_runs_it_faster(monkeypatch, flags, kernels_build, expected):
    monkeypatch.setattr(device, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(cpu_kernels, "can_build", lambda: kernels_build)
    assert device.resolve_dtype("auto", "cpu") == expected
    assert device.resolve_dtype("float32", "cpu") == "float32"  # an explicit dtype is never second-guessed


def test_the_kernels_cannot_build_when_turned_off_or_without_a_compiler(monkeypatch):
    monkeypatch.setenv("BATCHTOP_CPU_KERNEL", "0")
    assert not cpu_kernels.can_build()
    monkeypatch.delenv("BATCHTOP_CPU_KERNEL")
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert not cpu_kernels.can_build()


def test_a_bf16_roof_without_native_bf16_does_not_time_a_minute_long_gemm(monkeypatch):
    """The dashboard waits for its roofs before it draws; on an AVX2 CPU, before batchtop's kernels are
    in, torch's emulated bf16 GEMM is what gets timed, and at 2048^3 that takes about a minute."""
    from batchtop.core_engine.perf import device_peaks as dp
    monkeypatch.setattr(dp, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(dp, "kernels_in_use", lambda device, dtype: False)
    peaks = dp.measure_peaks("cpu", "bfloat16", copy_mib=16)
    assert peaks.source.endswith("bfloat16 GEMM 256^3") and peaks.peak_flops > 0
