"""What an attach session watches and how: its options, resolved URLs, roofs and model estimate."""

from __future__ import annotations

from dataclasses import dataclass

from batchtop.core_engine.attach.monitor import Monitor
from batchtop.core_engine.attach.record.record import AttachRecorder, attach_header
from batchtop.core_engine.attach.server_point import ModelEstimate
from batchtop.core_engine.attach.streams.served_model import served_tokenizer
from batchtop.core_engine.attach.streams.step_point import StepPricer
from batchtop.core_engine.attach.streams.stream_state import StreamState
from batchtop.core_engine.attach.streams.taps import StreamOptions
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
    vllm_log: str | None = None  # a server log to follow for its step lines ("-": standard input)
    kv_events: str | None = None  # tcp://HOST:PORT of its KV-event publisher
    kv_replay: str | None = None  # that publisher's replay endpoint
    model_params: float | None = None  # the served model's parameter count, where its dims are unknown
    metrics_only: bool = False  # a batchtop server: its /metrics panels, not its engine's step stream
    api_key: str | None = None  # a batchtop server's API key, for its step stream (/metrics needs none)
    vllm_log_fd: int | None = None  # where "-" is read once the dashboard has the terminal (not an option)
    vllm_log_from: int | None = None  # the log file's size once the options were checked (not an option)

    @property
    def streams(self) -> StreamOptions:
        return StreamOptions(self.vllm_log, self.kv_events, self.kv_replay, log_fd=self.vllm_log_fd,
                             log_from=self.vllm_log_from)

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
                       estimate=self.estimate, streams=self.stream_state())

    def stream_state(self) -> StreamState | None:
        opts = self.opts
        if not opts.streams:
            return None
        state = StreamState(log=bool(opts.vllm_log), kv=bool(opts.kv_events),
                            pricer=StepPricer(self.estimate, opts.model_params, opts.dtype))
        state.decode = served_tokenizer(opts.model) if opts.kv_events else None
        return state

    def recorder(self) -> AttachRecorder | None:
        if self.opts.record is None:
            return None
        return AttachRecorder(self.opts.record, attach_header(
            self.urls, self.opts.interval, self.window_s, self.opts.max_num_seqs, self.estimate,
            self.peaks.as_dict() if self.peaks is not None else None, self._streams_header())
            | {"peaks_note": self.peaks_note})

    def _streams_header(self) -> dict | None:
        opts = self.opts
        if not opts.streams:
            return None
        return {"log": opts.vllm_log, "kv_events": opts.kv_events, "model_params": opts.model_params,
                "tokenizer": opts.model}
