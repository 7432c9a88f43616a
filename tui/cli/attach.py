"""`batchtop attach URL...`: the console over live vLLM / SGLang / batchtop servers, or, with
--headless --duration S, the same numbers as batchtop.attach/1 JSON. Imports no Textual until the
dashboard starts."""

from __future__ import annotations

import dataclasses
import signal
import sys
import traceback

from batchtop.core_engine.attach.scrape.identity import refuse_duplicates
from batchtop.core_engine.attach.monitor import AttachFrame, Monitor
from batchtop.core_engine.attach.peaks import attach_peaks
from batchtop.core_engine.attach.report import attach_report
from batchtop.core_engine.attach.setup import AttachOptions, AttachSetup
from batchtop.core_engine.attach.server_point import ModelEstimate
from batchtop.core_engine.attach.scrape.scrape import metrics_url
from batchtop.core_engine.attach.watch import AttachWatch
from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.run.stop import Terminated, exit_status
from batchtop.tui.cli.attach_engine_stream import open_engine_stream
from batchtop.tui.cli.attach_export import export_workload
from batchtop.tui.cli.attach_streams import check_streams, terminal_for_keys
from batchtop.tui.cli.headless import note
from batchtop.tui.cli.options import bad_input_exits
from batchtop.core_engine.output_files import check_outputs, deliver_json


def prepare(urls: tuple[str, ...], opts: AttachOptions) -> AttachSetup:
    """Every check before the first scrape: URLs, option combinations, output paths, model, roofs."""
    resolved = [metrics_url(u) for u in urls]
    twice = next((u for i, u in enumerate(resolved) if u in resolved[:i]), None)
    if twice is not None:
        raise ConfigError("URL", f"{twice} is given twice: its numbers would count twice in the aggregate")
    refuse_duplicates(list(urls), resolved)  # one server under two spellings (localhost, a path, a 0 port)
    if opts.timeout is not None and opts.timeout >= opts.interval:
        raise ConfigError("--timeout", f"{opts.timeout:g} s must be shorter than --interval {opts.interval:g} s")
    if opts.headless and opts.duration is None:
        raise ConfigError("--duration", "--headless needs --duration S (seconds to watch before writing the JSON)")
    if not opts.headless and (opts.output is not None or opts.duration is not None):
        raise ConfigError("--output" if opts.output is not None else "--duration", "only with --headless")
    check_outputs({"--output": opts.output, "--record": opts.record, "--export-workload": opts.export_workload})
    opts = check_streams(opts)
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
    watch = AttachWatch(setup)
    tty = sys.stderr.isatty()
    exit_code = exit_status(signal.SIGINT)
    error: str | None = None

    def progress(frame: AttachFrame) -> None:
        if tty:
            sys.stderr.write(progress_line(frame))
            sys.stderr.flush()

    try:  # SIGTERM raises Terminated here (see tui.cli): the watch ends as on Ctrl-C, with the JSON of what was seen
        watch.run(progress)
    except KeyboardInterrupt as exc:
        exit_code = exit_status(signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
    except Exception as exc:  # --record's disk filling up, or a bug: what was seen is written all the same
        error = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, OSError):
            traceback.print_exc()
    finally:
        if tty:
            sys.stderr.write("\n")
    if watch.close_error is not None:
        error = error or f"{type(watch.close_error).__name__}: {watch.close_error}"
    monitor, frame, complete = watch.monitor, watch.frame, watch.complete
    doc = attach_report(monitor, frame, interval_s=opts.interval, peaks=setup.peaks, peaks_note=setup.peaks_note,
                        complete=complete and error is None)
    if error is not None:
        doc["error"] = error
    written = deliver_json(doc, opts.output)
    for s in frame.replicas:
        if s.status != "LIVE":
            note(f"{s.name}: {s.status}: {s.reason}")
    for line in verdict_lines(monitor, frame):
        note(line)
    exported = opts.export_workload is None or export_workload(monitor, opts.export_workload)
    if error is not None:
        note(f"error: {error}; the JSON holds what was seen before it")
        return 1
    if not complete:
        return exit_code
    return 0 if written and exported else 1


def verdict_lines(monitor: Monitor, frame: AttachFrame) -> list[str]:
    """The verdict at the end of the watch and, when another held longer (the end is a load draining),
    that one too, or the client's batches where the whole watch shows them and no tick could."""
    if frame.verdict is None:
        return []
    out = [f"verdict: {frame.verdict.line}" + (f"; {frame.verdict.advice}" if frame.verdict.advice else "")]
    whole = monitor.tracker.over_watch(frame.history)
    if whole is not None:
        return out + [f"over the whole watch: {whole.line}" + (f"; {whole.advice}" if whole.advice else "")]
    longest = monitor.tracker.longest()
    if longest is not None and longest.kind != frame.verdict.kind:
        out.append(f"held longest: {longest.kind} for {longest.seconds:.0f} s of {frame.t:.0f} s (t = "
                   f"{longest.from_t:.0f}-{longest.to_t:.0f} s): {longest.line}"
                   + (f"; {longest.advice}" if longest.advice else ""))
    return out


def run_attach(urls: tuple[str, ...], opts: AttachOptions) -> None:
    with bad_input_exits():
        setup = prepare(urls, opts)
    stream = open_engine_stream(setup)
    if stream is not None:  # a batchtop server: its engine's own panels, from the snapshots it steps
        from batchtop.tui.app import BatchtopApp  # Textual loads only here
        from batchtop.tui.sources.stream import StreamSource
        note(f"attaching to {stream.url}: the engine's panels, read-only (--metrics-only: its /metrics panels)")
        sys.exit(BatchtopApp(StreamSource(stream), theme=opts.theme).run() or 0)
    note(f"attaching to {', '.join(setup.urls)} every {opts.interval:g} s (timeout {opts.timeout_s:g} s); "
         f"roofs: {setup.peaks_note}")
    if opts.headless:
        sys.exit(run_headless(setup))
    from batchtop.tui.app import BatchtopApp  # Textual loads only here
    from batchtop.tui.sources.attach import AttachSource

    with bad_input_exits():
        setup = dataclasses.replace(setup, opts=terminal_for_keys(setup.opts))
    source = AttachSource(setup)
    code = BatchtopApp(source, theme=opts.theme).run() or 0
    if opts.export_workload is not None:
        source.done.wait(5.0)  # the feed's last scrape is in the monitor before the workload is drawn from it
        if not export_workload(source.monitor, opts.export_workload):
            code = code or 1
    sys.exit(code)
