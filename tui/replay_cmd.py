"""`batchtop replay TRACE`: play a recorded session in the dashboard, or recompute its metrics."""

from __future__ import annotations

import sys

from core_engine.config import config_from_dict
from core_engine.device_peaks import peaks_from_dict
from core_engine.metrics import MetricsCollector
from core_engine.trace import Trace, read_trace
from tui.headless_cmd import note
from tui.options import bad_input_exits
from tui.output import check_writable, write_json


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
    doc["replayed_from"] = trace.path
    return doc


def run_replay(path: str, *, headless: bool, output: str | None, speed: float, theme: str) -> None:
    with bad_input_exits():
        trace = read_trace(path)
        check_writable(output)
        config = config_from_dict(trace.header["config"])
    for warning in trace.warnings:
        note(f"warning: {warning}")
    if headless:
        write_json(replay_metrics(trace), output)
        return
    from tui.replay_app import ReplayApp  # Textual loads only here
    from tui.replay_source import ReplaySource

    source = ReplaySource(trace, speed=speed)
    device = trace.header.get("device", {}).get("name", config.device)
    app = ReplayApp(source, config, peaks_from_dict(trace.header.get("peaks")), device_label=f"{device} (recorded)",
                    theme=theme)
    sys.exit(app.run() or 0)
