"""`batchtop attach URL...`: the console over live vLLM / SGLang / batchtop servers, or, with
--headless --duration S, the same numbers as batchtop.attach/1 JSON. Imports no Textual until the
dashboard starts."""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass

from batchtop.core_engine.attach.monitor import AttachFrame, LivePoller, Monitor
from batchtop.core_engine.attach.peaks import attach_peaks
from batchtop.core_engine.attach.record import AttachRecorder, attach_header
from batchtop.core_engine.attach.report import attach_report
from batchtop.core_engine.attach.roofline_point import ModelEstimate
from batchtop.core_engine.attach.scrape import metrics_url
from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.run.stop import Terminated, exit_status
from batchtop.tui.cli.headless import note
from batchtop.tui.cli.options import bad_input_exits
from batchtop.core_engine.output_files import check_outputs, deliver_json


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


def prepare(urls: tuple[str, ...], opts: AttachOptions) -> AttachSetup:
    """Every check before the first scrape: URLs, option combinations, output paths, model, roofs."""
    resolved = [metrics_url(u) for u in urls]
    if opts.timeout is not None and opts.timeout >= opts.interval:
        raise ConfigError("--timeout", f"{opts.timeout:g} s must be shorter than --interval {opts.interval:g} s")
    if opts.headless and opts.duration is None:
        raise ConfigError("--duration", "--headless needs --duration S (seconds to watch before writing the JSON)")
    if not opts.headless and (opts.output is not None or opts.duration is not None):
        raise ConfigError("--output" if opts.output is not None else "--duration", "only with --headless")
    check_outputs({"--output": opts.output, "--record": opts.record})
    estimate = None
    if opts.model is not None:
        from batchtop.core_engine.run.resolve import resolve_model
        estimate = ModelEstimate(resolve_model(opts.model, "cpu-demo"), opts.dtype)
    peaks, peaks_note = attach_peaks(opts.device, resolved, opts.dtype)
    return AttachSetup(resolved, opts, estimate, peaks, peaks_note)


def progress_line(frame: AttachFrame) -> str:
    m = frame.main
    rate = m.rates.get("generation_tokens")
    parts = [f"{s.status}" for s in frame.replicas]
    return (f"\rattach t={frame.t:.0f}s [{' '.join(parts)}] running {m.running or 0:.0f} waiting "
            f"{m.waiting or 0:.0f} gen {rate or 0:.0f} tok/s ")


def run_headless(setup: AttachSetup) -> int:
    """Scrape every --interval for --duration seconds, then write batchtop.attach/1 JSON."""
    opts = setup.opts
    poller = LivePoller(setup.urls, opts.interval, opts.timeout_s)
    monitor = setup.monitor()
    recorder = setup.recorder()
    frame = monitor.frame()
    complete = False
    tty = sys.stderr.isatty()
    exit_code = exit_status(signal.SIGINT)
    try:  # SIGTERM raises Terminated here (see tui.cli): the watch ends as on Ctrl-C, with the JSON of what was seen
        while True:
            results, t = poller.poll()
            frame = monitor.feed(results, t)
            if recorder is not None:
                recorder.tick(frame.tick, t, results)
            if tty:
                sys.stderr.write(progress_line(frame))
                sys.stderr.flush()
            if t >= opts.duration:
                complete = True
                break
            next_tick = frame.tick * opts.interval
            time.sleep(max(0.0, min(next_tick, opts.duration) - (poller.clock() - poller.t0)))
    except KeyboardInterrupt as exc:
        exit_code = exit_status(signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
    finally:
        poller.close()
        if recorder is not None:
            recorder.close(frame.t, "finished" if complete else "interrupted")
        if tty:
            sys.stderr.write("\n")
    written = deliver_json(attach_report(monitor, frame, interval_s=opts.interval, peaks=setup.peaks,
                                         peaks_note=setup.peaks_note, complete=complete), opts.output)
    for s in frame.replicas:
        if s.status != "LIVE":
            note(f"{s.name}: {s.status}: {s.reason}")
    if not complete:
        return exit_code
    return 0 if written else 1


def run_attach(urls: tuple[str, ...], opts: AttachOptions) -> None:
    with bad_input_exits():
        setup = prepare(urls, opts)
    note(f"attaching to {', '.join(setup.urls)} every {opts.interval:g} s (timeout {opts.timeout_s:g} s); "
         f"roofs: {setup.peaks_note}")
    if opts.headless:
        sys.exit(run_headless(setup))
    from batchtop.tui.attach_app import AttachApp  # Textual loads only here
    from batchtop.tui.sources.attach import LiveFeed

    feed = LiveFeed(setup)
    app = AttachApp(feed, setup.peaks, setup.peaks_note, theme=opts.theme)
    sys.exit(app.run() or 0)
