"""`batchtop replay TRACE`: play a recorded session in the dashboard, or recompute its metrics."""

from __future__ import annotations

import sys

from batchtop.core_engine.config import config_from_dict
from batchtop.core_engine.measure.device_peaks import peaks_from_dict
from batchtop.core_engine.measure.metrics import MetricsCollector
from batchtop.core_engine.session.trace import Trace, read_trace
from batchtop.tui.commands.headless import note
from batchtop.tui.commands.options import bad_input_exits
from batchtop.tui.commands.output import check_writable, write_json


def replay_metrics(trace: Trace) -> dict:
    """The metrics JSON of the recorded run, folded from its snapshots exactly as the live run did."""
    collector = MetricsCollector()
    for _, snap in trace.snapshots():
        if snap is not None:
            collector.observe(snap)
    end = trace.events[-1] if trace.events else {}
    complete = end.get("type") == "end" and end.get("reason") == "finished"
    doc = collector.summary(trace.header["config"], complete=complete, workload=trace.header.get("workload"),
                            peaks=peaks_from_dict(trace.header.get("peaks")))
    if trace.header.get("simulated"):
        doc["simulated"] = trace.header["simulated"]
    doc["replayed_from"] = trace.path
    return doc


def run_replay(path: str, *, headless: bool, output: str | None, speed: float, theme: str) -> None:
    with bad_input_exits():
        trace = read_trace(path)
        if trace.header.get("source") == "attach":  # from `batchtop attach --record`: its own panels
            from batchtop.tui.commands.attach_replay import run_attach_replay
            return run_attach_replay(trace, headless=headless, output=output, speed=speed, theme=theme)
        check_writable(output)
        config = config_from_dict(trace.header["config"])
    for warning in trace.warnings:
        note(f"warning: {warning}")
    if headless:
        write_json(replay_metrics(trace), output)
        return
    from batchtop.tui.replay_app import ReplayApp  # Textual loads only here
    from batchtop.tui.replay_source import ReplaySource
    from batchtop.tui.widgets.waiting import arrivals_label

    source = ReplaySource(trace, speed=speed)
    device = trace.header.get("device", {}).get("name", config.device)
    how = "simulated, recorded" if trace.header.get("simulated") else "recorded"
    app = ReplayApp(source, config, peaks_from_dict(trace.header.get("peaks")), device_label=f"{device} ({how})",
                    arrivals=arrivals_label(trace.header.get("workload")),
                    theme=theme)
    sys.exit(app.run() or 0)
