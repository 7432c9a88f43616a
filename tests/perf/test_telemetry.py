"""Telemetry degrades to 'unavailable, because ...' on machines without a GPU, and its thread never dies or lingers."""

from __future__ import annotations

import json
import sys
import time
import types

import pynvml
import pytest

from batchtop.core_engine.perf.telemetry import GPU_FIELDS, NvmlReader, ProcessReader, TelemetrySample, TelemetrySampler


def fake_pynvml(calls: list[str], broken: tuple[str, ...] = ()) -> types.SimpleNamespace:
    """A GPU whose named queries raise NotSupported, as power does on some boards."""

    def query(name, value):
        def fn(*args):
            calls.append(name)
            if name in broken:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return value
        return fn

    names = {
        "nvmlInit": None, "nvmlShutdown": None, "nvmlDeviceGetHandleByIndex": "handle0",
        "nvmlDeviceGetName": "Fake H100", "nvmlDeviceGetMaxClockInfo": 1980, "nvmlDeviceGetClockInfo": 1410,
        "nvmlDeviceGetUtilizationRates": types.SimpleNamespace(gpu=42, memory=7),
        "nvmlDeviceGetMemoryInfo": types.SimpleNamespace(used=3 << 30, total=80 << 30, free=77 << 30),
        "nvmlDeviceGetPowerUsage": 250_000, "nvmlDeviceGetEnforcedPowerLimit": 700_000,
        "nvmlDeviceGetTemperature": 55,
    }
    return types.SimpleNamespace(NVML_CLOCK_SM=1, NVML_TEMPERATURE_GPU=0,
                                 **{name: query(name, value) for name, value in names.items()})


def assert_gpu_unavailable(sample: TelemetrySample) -> None:
    assert sample.available is False and sample.reason
    assert all(getattr(sample, field) is None for field in GPU_FIELDS)
    assert sample.process_rss_bytes and sample.process_cpu_pct is not None  # process values are always there


def test_this_machine_never_raises_and_says_why_when_no_gpu():
    sample = TelemetrySampler("cuda").sample_now()
    assert sample.kind == "cuda"
    if not sample.available:
        assert_gpu_unavailable(sample)


def test_driver_not_loaded_is_reported_as_the_reason(monkeypatch):
    def init():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    monkeypatch.setattr(pynvml, "nvmlInit", init)
    sampler = TelemetrySampler("cuda")
    sample = sampler.sample_now()
    assert_gpu_unavailable(sample)
    assert sample.reason == "NVML: Driver Not Loaded"
    sampler.stop()  # never started, never initialised: nothing to shut down, nothing raises


def test_missing_nvidia_ml_py_is_reported_as_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    sample = TelemetrySampler("cuda").sample_now()
    assert_gpu_unavailable(sample)
    assert "nvidia-ml-py not installed" in sample.reason


def test_cpu_device_never_touches_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(calls := []))
    sample = TelemetrySampler("cpu").sample_now()
    assert_gpu_unavailable(sample)
    assert sample.kind == "cpu" and sample.reason == "device is cpu" and calls == []
    json.dumps(sample.as_dict())


def test_unsupported_power_query_blanks_only_the_power_fields(monkeypatch):
    broken = ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit")
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(calls := [], broken))
    sampler = TelemetrySampler("cuda")
    first, sample = sampler.sample_now(), sampler.sample_now()
    assert first.available and sample.available and sample.reason is None
    assert (sample.device_name, sample.gpu_util_pct, sample.temperature_c) == ("Fake H100", 42.0, 55)
    assert (sample.mem_used_bytes, sample.mem_total_bytes) == (3 << 30, 80 << 30)
    assert (sample.sm_clock_mhz, sample.sm_clock_max_mhz) == (1410, 1980)
    assert sample.power_w is None and sample.power_limit_w is None
    assert json.loads(json.dumps(sample.as_dict()))["gpu_util_pct"] == 42.0
    sampler.stop()
    assert calls.count("nvmlInit") == 1 and calls.count("nvmlShutdown") == 1


def test_power_in_watts_when_supported(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([]))
    sample = NvmlReader().read()
    assert (sample["power_w"], sample["power_limit_w"]) == (250.0, 700.0)


def test_a_gpu_that_answers_nothing_is_unavailable(monkeypatch):
    every_query = ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPowerUsage",
                   "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetClockInfo", "nvmlDeviceGetTemperature")
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], every_query))
    sample = TelemetrySampler("cuda").sample_now()
    assert_gpu_unavailable(sample)
    assert sample.reason == "NVML: Not Supported"


def test_process_cpu_and_rss_are_plausible():
    reader = ProcessReader()
    values = reader.read()
    assert values["process_rss_bytes"] > 10 << 20 and values["process_cpu_pct"] >= 0
    end = time.monotonic() + 0.2
    while time.monotonic() < end:
        pass
    assert reader.read()["process_cpu_pct"] > 20


def test_thread_publishes_latest_and_stops_promptly():
    sampler = TelemetrySampler("cpu", interval_s=30.0)  # stop() must wake the wait, not sit it out
    assert sampler.latest is None
    sampler.start()
    deadline = time.monotonic() + 1.0
    while sampler.latest is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sampler.latest is not None and sampler.latest.kind == "cpu"
    t0 = time.monotonic()
    sampler.stop()
    assert time.monotonic() - t0 < 1.0


class ExplodingReader(NvmlReader):
    def read(self):
        raise RuntimeError("boom")


def test_thread_survives_a_reader_that_raises():
    sampler = TelemetrySampler("cuda", interval_s=0.01, nvml=ExplodingReader())
    sampler.start()
    seen: set[float] = set()
    deadline = time.monotonic() + 1.0
    while len(seen) < 3 and time.monotonic() < deadline:  # several samples: the thread lived past the first
        if sampler.latest is not None:
            seen.add(sampler.latest.t)
        time.sleep(0.005)
    sampler.stop()
    assert len(seen) >= 3
    assert_gpu_unavailable(sampler.latest)
    assert "RuntimeError" in sampler.latest.reason and "boom" in sampler.latest.reason


@pytest.mark.parametrize("error", [RuntimeError("libnvidia-ml is broken"), OSError("cannot open shared object")])
def test_a_broken_install_is_a_reason_not_a_traceback(monkeypatch, error):
    def init():
        raise error
    monkeypatch.setattr(pynvml, "nvmlInit", init)
    sample = TelemetrySampler("cuda").sample_now()
    assert_gpu_unavailable(sample)
    assert str(error) in sample.reason
