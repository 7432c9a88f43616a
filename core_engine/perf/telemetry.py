"""Device telemetry, sampled a few times a second on its own thread so the engine's hot path never waits on it.

In the spirit of nvitop's NVML layer, every query has a default: a machine without a GPU, a driver or
nvidia-ml-py yields a sample that says why its GPU values are unavailable, never a traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

T = TypeVar("T")
GPU_FIELDS = ("device_name", "gpu_util_pct", "mem_used_bytes", "mem_total_bytes", "power_w", "power_limit_w",
              "sm_clock_mhz", "sm_clock_max_mhz", "temperature_c")


@dataclass(frozen=True, slots=True)
class TelemetrySample:
    t: float  # time.monotonic() when taken
    kind: str  # "cuda" or "cpu"
    available: bool  # whether the GPU values could be read at all
    reason: str | None = None  # why they could not
    device_name: str | None = None
    gpu_util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    temperature_c: int | None = None
    process_cpu_pct: float | None = None  # this process since the previous sample, % of one core (like top)
    process_rss_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _describe(exc: BaseException) -> str:
    """NVMLError.__str__ may itself call into the library; a reason string must never raise."""
    try:
        return str(exc) or type(exc).__name__
    except Exception:
        return type(exc).__name__


def _unexpected(exc: BaseException) -> str:
    return f"telemetry error: {type(exc).__name__}: {_describe(exc)}"


def _try(query: Callable[[], T], errors: list[BaseException]) -> T | None:
    """One unsupported query (power on some boards) costs that field only."""
    try:
        return query()
    except Exception as exc:  # NVMLError subclasses, or anything from a broken install
        errors.append(exc)
        return None


class NvmlReader:
    """Reads one GPU through NVML; opens lazily on the first read, so that happens on the sampler's thread."""

    def __init__(self, gpu_index: int = 0) -> None:
        self.gpu_index = gpu_index
        self._reset()

    def _reset(self) -> None:  # closed: a later read opens afresh
        self._nvml: Any = None
        self._handle: Any = None
        self._reason: str | None = None
        self._opened = False
        self._static: dict[str, Any] = {}

    def _open(self) -> None:
        self._opened = True
        try:
            import pynvml
        except Exception as exc:
            self._reason = ("nvidia-ml-py not installed" if isinstance(exc, ImportError)
                            else f"nvidia-ml-py failed to import: {_describe(exc)}")
            return
        stage = "NVML"
        try:
            pynvml.nvmlInit()
            self._nvml, stage = pynvml, f"NVML: GPU {self.gpu_index}"
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.gpu_index)
        except Exception as exc:
            self._reason = f"{stage}: {_describe(exc)}"
            return
        name = _try(lambda: pynvml.nvmlDeviceGetName(self._handle), [])
        self._static = {  # fixed for the life of the device: read once
            "device_name": name.decode(errors="replace") if isinstance(name, bytes) else name,
            "sm_clock_max_mhz": _try(lambda: pynvml.nvmlDeviceGetMaxClockInfo(self._handle, pynvml.NVML_CLOCK_SM), []),
        }

    def read(self) -> dict[str, Any]:
        """`available`, `reason` and the GPU fields of TelemetrySample."""
        if not self._opened:
            self._open()
        if self._handle is None:
            return {"available": False, "reason": self._reason or "NVML: not opened"}
        nv, h, errors = self._nvml, self._handle, []
        mem = _try(lambda: nv.nvmlDeviceGetMemoryInfo(h), errors)
        values = {
            "gpu_util_pct": _try(lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu), errors),
            "mem_used_bytes": getattr(mem, "used", None),
            "mem_total_bytes": getattr(mem, "total", None),
            "power_w": _try(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0, errors),  # NVML reports milliwatts
            "power_limit_w": _try(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0, errors),
            "sm_clock_mhz": _try(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM), errors),
            "temperature_c": _try(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU), errors),
        }
        if errors and all(v is None for v in values.values()):  # e.g. the GPU fell off the bus
            return {"available": False, "reason": f"NVML: {_describe(errors[-1])}"}
        return {"available": True, "reason": None, **self._static, **values}

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
        self._reset()


class ProcessReader:
    """This process's CPU use (os.times deltas over monotonic deltas) and resident memory; no psutil."""

    def __init__(self) -> None:
        self._last = self._now()

    @staticmethod
    def _now() -> tuple[float, float]:
        times = os.times()
        return time.monotonic(), times.user + times.system

    def cpu_pct(self) -> float | None:
        """% of one core since the previous call (or since construction, for the first)."""
        (t0, c0), (t1, c1) = self._last, self._now()
        self._last = (t1, c1)
        return max(0.0, 100.0 * (c1 - c0) / (t1 - t0)) if t1 > t0 else None

    @staticmethod
    def rss_bytes() -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        try:  # no /proc (macOS): the peak, in bytes there, the best the standard library offers
            import resource
            return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        except Exception:
            return None

    def read(self) -> dict[str, Any]:
        return {"process_cpu_pct": self.cpu_pct(), "process_rss_bytes": self.rss_bytes()}


class TelemetrySampler:
    """Samples on a daemon thread every interval_s; readers take `latest`, one reference swapped per sample."""

    def __init__(self, device: str, interval_s: float = 0.5, gpu_index: int = 0, *,
                 nvml: NvmlReader | None = None) -> None:
        self.device = device
        self.kind = "cuda" if device == "cuda" or device.startswith("cuda:") else "cpu"
        self.interval_s = interval_s
        self._nvml = nvml if nvml is not None else (NvmlReader(gpu_index) if self.kind == "cuda" else None)
        self._process = ProcessReader()
        self._lock = threading.Lock()  # sample_now may race the thread over the readers' state
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._latest: TelemetrySample | None = None

    @property
    def latest(self) -> TelemetrySample | None:
        return self._latest

    def _gpu_reading(self) -> dict[str, Any]:
        """An unexpected exception becomes an unavailable reading with the reason, never a dead thread."""
        if self._nvml is None:
            return {"available": False, "reason": f"device is {self.device}"}
        try:
            reading = self._nvml.read()
            return {"available": False, **{k: reading[k] for k in ("available", "reason", *GPU_FIELDS) if k in reading}}
        except Exception as exc:
            return {"available": False, "reason": _unexpected(exc)}

    def sample_now(self) -> TelemetrySample:
        """A synchronous read (tests, headless); it also becomes `latest`."""
        with self._lock:
            try:
                sample = TelemetrySample(time.monotonic(), self.kind, **self._gpu_reading(), **self._process.read())
            except Exception as exc:  # nothing leaves the thread
                sample = TelemetrySample(time.monotonic(), self.kind, available=False, reason=_unexpected(exc))
            self._latest = sample
            return sample

    def _run(self, stop: threading.Event) -> None:
        while True:
            self.sample_now()
            if stop.wait(self.interval_s):  # wakes at once on stop()
                return

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop = threading.Event()  # a fresh one: a thread stuck past an earlier stop() still sees its own
        self._thread = threading.Thread(target=self._run, args=(self._stop,), name="batchtop-telemetry", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        """Wakes the thread, joins it, and closes NVML unless the thread is stuck inside an NVML call."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                return
        if self._nvml is not None:
            with self._lock:
                self._nvml.close()
