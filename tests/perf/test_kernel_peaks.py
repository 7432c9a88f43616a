"""Where batchtop's bf16 CPU kernels run, the roofs a CPU run is measured against are what those kernels
reach, so a decode step's fraction of the roof is a fraction: above 0, at most 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.perf import device_peaks as dp
from batchtop.core_engine.perf.kernel_peaks import kernels_in_use
from batchtop.core_engine.perf.live_roofs import LiveRoofs
from batchtop.gpu_kernels import cpu_kernels
from tests.conftest import make_requests, run_all, tiny_config

pytestmark = pytest.mark.skipif(not cpu_kernels.linear_bf16_usable(),
                                reason="needs batchtop's bf16 CPU kernels (AVX512_BF16, or AVX2 and FMA)")

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


def test_new_kernels_and_new_probes_are_measured_again_not_read_from_the_old_cache(tmp_path, monkeypatch):
    """A faster kernel build must not be held to the roofs its predecessor was measured at (its steps
    would read above 100% of them), nor a run to roofs an older, flawed probe measured."""
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
    monkeypatch.setattr(dp, "PROBES_VERSION", dp.PROBES_VERSION + 1)
    assert "(cached)" not in dp.device_peaks("cpu", "bfloat16").source
    assert len(measured) == 3


def test_a_real_bf16_cpu_run_reports_a_fraction_of_the_roof_between_0_and_1(tmp_path, monkeypatch):
    """The roofs are what a run is placed against: measured before it, on the kernels it runs (never
    torch's ops: those read 300x low on an AVX2 CPU), and measured once more when a step beats them by
    more than noise, each roof kept at the better measurement (one taken while the host was busy reads
    low and was the flake here: a step then ran at 1.9x a 12 GB/s roof that measured 19 GB/s a minute on)."""
    monkeypatch.setenv("BATCHTOP_CACHE_DIR", str(tmp_path))
    engine = Engine(tiny_config(model=WIDE, dtype="bfloat16", max_num_seqs=16, max_num_batched_tokens=256,
                                block_size=16, num_kv_blocks=64))
    roofs = LiveRoofs(dp.device_peaks("cpu", "bfloat16"), "cpu", "bfloat16")
    assert roofs.peaks.with_batchtop_kernels, roofs.peaks.source
    _, _, metrics = run_all(engine, make_requests(16, seed=3, prompt=(8, 16), output=(24, 32)),
                            check=lambda engine, snap: roofs.observe(snap))
    roofline = metrics.roofline(roofs.peaks)
    assert roofline["decode"]["steps"] > 10
    assert 0 < roofline["decode"]["fraction_of_roof_mean"] <= 1, (roofline, roofs.view.note)


def test_the_bandwidth_roof_is_measured_on_a_stream_no_cache_holds(monkeypatch):
    """A stream twice the L3's size is partly served from the L3 on the next pass, and a roof measured on
    it sits above what a model's weights stream at: the GEMV probe streams the copy's bytes, and the
    probes stream several times this machine's last-level cache."""
    from batchtop.core_engine.perf import kernel_peaks as kp
    streamed = []
    real = kp.kernel_peaks
    monkeypatch.setattr(dp, "kernel_peaks", lambda **kw: streamed.append(kw["gemv_mib"]) or
                        real(gemm_n=256, gemm_rows=(16,), gemv_mib=kw["gemv_mib"]))
    monkeypatch.setattr(dp.torch.Tensor, "__matmul__", lambda *a: pytest.fail("torch's bf16 GEMM was timed"))
    peaks = dp.measure_peaks("cpu", "bfloat16", copy_mib=16, gemm_n=256)
    # torch's bf16 GEMM is not timed beside the kernels' own: on an AVX2 CPU it takes a minute at 2048^3
    assert streamed == [16] and "GEMV 16 MiB" in peaks.source and "bfloat16 GEMM" not in peaks.source
    llc = dp.last_level_cache_bytes()
    if Path("/sys/devices/system/cpu/cpu0/cache/index0/size").is_file():
        assert llc is not None and llc >= 16 << 10, llc  # sysfs lists the caches: at least an L1 was read
    assert dp.probe_mib() << 20 >= max(4 * (llc or 0), 256 << 20), (dp.probe_mib(), llc)

