"""Where batchtop's bf16 CPU kernels run, the roofs a CPU run is measured against are what those kernels
reach, so a decode step's fraction of the roof is a fraction: above 0, at most 1."""

from __future__ import annotations

import pytest

from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.perf import device_peaks as dp
from batchtop.core_engine.perf.kernel_peaks import kernels_in_use
from batchtop.gpu_kernels import cpu_kernels
from tests.conftest import make_requests, run_all, tiny_config

pytestmark = pytest.mark.skipif(not cpu_kernels.linear_bf16_usable(),
                                reason="needs batchtop's bf16 CPU kernels (AVX512_BF16)")

# one layer wide enough that a 16-row decode step is mostly GEMM, as on a real model
WIDE = ModelConfig("wide", vocab_size=512, hidden_size=1024, intermediate_size=2816, num_hidden_layers=1,
                   num_attention_heads=8, num_key_value_heads=4)


def test_bf16_cpu_roofs_are_measured_with_batchtops_kernels_and_cached_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHTOP_CACHE_DIR", str(tmp_path))
    real_measure = dp.measure_peaks
    monkeypatch.setattr(dp, "measure_peaks", lambda device, dtype: real_measure(device, dtype, copy_mib=16, gemm_n=256))
    assert kernels_in_use("cpu", "bfloat16") and not kernels_in_use("cpu", "float32")
    bf16, fp32 = dp.device_peaks("cpu", "bfloat16"), dp.device_peaks("cpu", "float32")
    assert "batchtop linear_bf16" in bf16.source and "batchtop" not in fp32.source
    assert len(list(tmp_path.glob("batchtop/peaks-*.json"))) == 2
    assert dp.device_peaks("cpu", "bfloat16").source == bf16.source + " (cached)"


def test_new_kernels_are_measured_again_not_read_from_the_old_kernels_cache(tmp_path, monkeypatch):
    """A faster kernel build must not be held to the roofs its predecessor was measured at (its steps
    would read above 100% of them)."""
    from batchtop.gpu_kernels import cpu_kernel_build
    monkeypatch.setenv("BATCHTOP_CACHE_DIR", str(tmp_path))
    real_measure = dp.measure_peaks
    measured = []
    monkeypatch.setattr(dp, "measure_peaks", lambda device, dtype: measured.append(dtype) or
                        real_measure(device, dtype, copy_mib=16, gemm_n=256))
    dp.device_peaks("cpu", "bfloat16")
    dp.device_peaks("cpu", "bfloat16")
    assert len(measured) == 1
    monkeypatch.setattr(cpu_kernel_build, "build_key", lambda: "another-build")
    assert "(cached)" not in dp.device_peaks("cpu", "bfloat16").source
    assert len(measured) == 2


def test_a_real_bf16_cpu_run_reports_a_fraction_of_the_roof_between_0_and_1(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHTOP_CACHE_DIR", str(tmp_path))
    engine = Engine(tiny_config(model=WIDE, dtype="bfloat16", max_num_seqs=16, max_num_batched_tokens=256,
                                block_size=16, num_kv_blocks=64))
    _, _, metrics = run_all(engine, make_requests(16, seed=3, prompt=(8, 16), output=(24, 32)))
    roofline = metrics.roofline(dp.device_peaks("cpu", "bfloat16"))
    assert roofline["decode"]["steps"] > 10
    assert 0 < roofline["decode"]["fraction_of_roof_mean"] <= 1, roofline
