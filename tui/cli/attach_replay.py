"""`batchtop replay FILE` for a recording made by `batchtop attach --record`: the attach panels over
the recorded scrapes, or (--headless) the batchtop.attach/1 JSON recomputed from them."""

from __future__ import annotations

import sys

from batchtop.core_engine.attach.record import monitor_for, recorded_ticks
from batchtop.core_engine.attach.report import attach_report
from batchtop.core_engine.perf.device_peaks import peaks_from_dict
from batchtop.core_engine.trace.trace import Trace
from batchtop.tui.cli.headless import note
from batchtop.tui.cli.options import bad_input_exits
from batchtop.core_engine.output_files import deliver_json


def replay_attach_report(trace: Trace) -> dict:
    """Every recorded scrape fed to a fresh Monitor, as the live session fed its own."""
    header = trace.header
    monitor = monitor_for(trace)
    frame = monitor.frame()
    for t, results in recorded_ticks(trace):
        frame = monitor.feed(results, t)
    return attach_report(monitor, frame, interval_s=float(header.get("interval_s") or 1.0),
                         peaks=peaks_from_dict(header.get("peaks")), peaks_note=header.get("peaks_note", "recorded"),
                         complete=trace.ended_cleanly, replayed_from=trace.path)


def run_attach_replay(trace: Trace, *, headless: bool, output: str | None, speed: float, theme: str) -> None:
    """Output paths are checked by `batchtop replay` before it hands the trace over."""
    with bad_input_exits():
        if headless:
            doc = replay_attach_report(trace)
    for warning in trace.warnings:
        note(f"warning: {warning}")
    if headless:
        sys.exit(0 if deliver_json(doc, output) else 1)
    from batchtop.tui.attach_app import AttachApp  # Textual loads only here
    from batchtop.tui.sources.attach import ReplayFeed

    with bad_input_exits():
        feed = ReplayFeed(trace, speed)
    app = AttachApp(feed, peaks_from_dict(trace.header.get("peaks")),
                    f"{trace.header.get('peaks_note', 'recorded')} (recorded)", theme=theme)
    sys.exit(app.run() or 0)
