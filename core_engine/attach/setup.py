"""What an attach session watches and how: its options, resolved URLs, roofs and model estimate."""

from __future__ import annotations

from dataclasses import dataclass

from batchtop.core_engine.attach.monitor import Monitor
from batchtop.core_engine.attach.record.record import AttachRecorder, attach_header
from batchtop.core_engine.attach.server_point import ModelEstimate
from batchtop.core_engine.perf.device_peaks import DevicePeaks


@dataclass(frozen=True, slots=True)
class AttachOptions:
    interval: float = 1.0
    window: float = 30.0
    timeout: float | None = None
    record: str | None = None
    headless: bool = False
    duration: float | None = None
    output: str | None = None
    max_num_seqs: int | None = None
    device: str | None = None
    model: str | None = None
    dtype: str = "bfloat16"
    theme: str = "batchtop-dark"
    export_workload: str | None = None

    @property
    def timeout_s(self) -> float:
        return self.timeout if self.timeout is not None else 0.8 * self.interval


@dataclass(frozen=True, slots=True)
class AttachSetup:
    urls: list[str]
    opts: AttachOptions
    estimate: ModelEstimate | None
    peaks: DevicePeaks | None
    peaks_note: str

    @property
    def window_s(self) -> float:
        """Headless, the percentiles cover the whole watch; on screen, the last --window seconds."""
        if self.opts.headless and self.opts.duration is not None:
            return max(self.opts.window, self.opts.duration + self.opts.interval)
        return self.opts.window

    def monitor(self) -> Monitor:
        return Monitor(self.urls, window_s=self.window_s, max_num_seqs=self.opts.max_num_seqs,
                       estimate=self.estimate)

    def recorder(self) -> AttachRecorder | None:
        if self.opts.record is None:
            return None
        return AttachRecorder(self.opts.record, attach_header(
            self.urls, self.opts.interval, self.window_s, self.opts.max_num_seqs, self.estimate,
            self.peaks.as_dict() if self.peaks is not None else None) | {"peaks_note": self.peaks_note})
