"""`batchtop replay FILE` for a recording made by `batchtop attach --record`: the attach panels over
the recorded scrapes, or (--headless) the batchtop.attach/1 JSON recomputed from them."""

from __future__ import annotations

import sys

from batchtop.core_engine.attach.monitor import AttachFrame, Monitor
from batchtop.core_engine.attach.record.record import monitor_for, recorded_stream_ticks
from batchtop.core_engine.attach.report import attach_report
from batchtop.core_engine.perf.device_peaks import peaks_from_dict
from batchtop.core_engine.trace.trace import Trace
from batchtop.tui.cli.attach_export import export_workload
from batchtop.tui.cli.headless import note
from batchtop.tui.cli.options import bad_input_exits
from batchtop.core_engine.output_files import deliver_json


def replayed(trace: Trace) -> tuple[Monitor, AttachFrame]:
    """Every recorded scrape and side-stream tick fed to a fresh Monitor, as the live session fed its own."""
    monitor = monitor_for(trace)
    frame = monitor.frame()
    for t, results, streams in recorded_stream_ticks(trace):
        frame = monitor.feed(results, t, streams)
    return monitor, frame


def replay_attach_report(trace: Trace, replay: tuple[Monitor, AttachFrame] | None = None) -> dict:
    header = trace.header
    monitor, frame = replay or replayed(trace)
    return attach_report(monitor, frame, interval_s=float(header.get("interval_s") or 1.0),
                         peaks=peaks_from_dict(header.get("peaks")), peaks_note=header.get("peaks_note", "recorded"),
                         complete=trace.ended_cleanly, replayed_from=trace.path)


def run_attach_replay(trace: Trace, *, headless: bool, output: str | None, speed: float, theme: str,
                      export_workload_to: str | None = None) -> None:
    """Output paths are checked by `batchtop replay` before it hands the trace over. With
    --export-workload the recording is replayed at once, without the dashboard."""
    with bad_input_exits():
        if headless or export_workload_to is not None:
            replay = replayed(trace)
            doc = replay_attach_report(trace, replay)
    for warning in trace.warnings:
        note(f"warning: {warning}")
    if export_workload_to is not None:
        written = not headless or deliver_json(doc, output)
        sys.exit(0 if export_workload(replay[0], export_workload_to) and written else 1)
    if headless:
        sys.exit(0 if deliver_json(doc, output) else 1)
    from batchtop.tui.app import BatchtopApp  # Textual loads only here
    from batchtop.tui.sources.attach import AttachReplaySource

    with bad_input_exits():
        source = AttachReplaySource(trace, speed)
    sys.exit(BatchtopApp(source, theme=theme).run() or 0)
