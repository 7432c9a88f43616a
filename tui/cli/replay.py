"""`batchtop replay TRACE`: play a recorded session in the dashboard, or recompute its metrics."""

from __future__ import annotations

import sys

from batchtop.core_engine.config import EngineConfig
from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.perf.isa_peak import isa_from_record
from batchtop.core_engine.perf.metrics import MetricsCollector
from batchtop.core_engine.perf.raised_roofs import RoofRaiser
from batchtop.core_engine.trace.trace import Trace, TraceError, read_trace
from batchtop.core_engine.trace.schema import HeaderError, engine_header
from batchtop.tui.cli.headless import note
from batchtop.tui.cli.options import bad_input_exits
from batchtop.core_engine.output_files import check_outputs, deliver_json
from batchtop.tui.export.options import DEFAULT_FPS, DEFAULT_SIZE, export_plan


def recorded_engine(trace: Trace) -> tuple[EngineConfig, DevicePeaks | None]:
    """The recorded engine's config and peaks; TraceError naming the field when the header lacks them."""
    try:
        return engine_header(trace.header)
    except HeaderError as exc:
        raise TraceError(f"{trace.path}:1: {exc}") from None


def recorded_roofs(trace: Trace, peaks: DevicePeaks | None) -> RoofRaiser | None:
    """The roofs the recorded run's steps raised, raised again by the same steps (never into this
    machine's cache), with the recording machine's ISA peaks; None where the run's were not raisable."""
    if trace.header.get("simulated") or not RoofRaiser.applies(peaks):
        return None
    return RoofRaiser(peaks, isa=isa_from_record(trace.header.get("isa_peaks")))


def replay_metrics(trace: Trace) -> dict:
    """The metrics JSON of the recorded run, folded from its snapshots exactly as the live run did."""
    collector = MetricsCollector()
    _, peaks = recorded_engine(trace)
    roofs = recorded_roofs(trace, peaks)
    for _, snap in trace.snapshots():
        if snap is not None:
            collector.observe(snap)
            if roofs is not None:
                roofs.observe(snap)
    end = trace.events[-1] if trace.events else {}
    complete = end.get("type") == "end" and end.get("reason") == "finished"
    doc = collector.summary(trace.header["config"], complete=complete, workload=trace.header.get("workload"),
                            peaks=roofs.peaks if roofs is not None else peaks,
                            roofs=roofs.as_dict() if roofs is not None else None)
    if trace.header.get("simulated"):
        doc["simulated"] = trace.header["simulated"]
    doc["replayed_from"] = trace.path
    return doc


def run_replay(path: str, *, headless: bool, output: str | None, speed: float, theme: str,
               export_workload: str | None = None, export: str | None = None, export_size: str = DEFAULT_SIZE,
               export_fps: float = DEFAULT_FPS) -> None:
    with bad_input_exits():
        plan = export_plan(export, export_size, export_fps, speed) if export is not None else None
        if plan is not None and headless:
            raise ConfigError("--export", "draws the dashboard into a file and --headless writes the metrics: "
                                          "give one of them")
        trace = read_trace(path)
        check_outputs({"--output": output, "--export-workload": export_workload, "--export": export},
                      {"TRACE": path})
        if plan is not None and trace.header.get("source") == "attach":
            raise ConfigError("--export", f"{path} is an attach recording: --export draws an engine session's "
                                          "panels (from `batchtop --record`) for now")
        if trace.header.get("source") == "attach":  # from `batchtop attach --record`: its own panels
            from batchtop.tui.cli.attach_replay import run_attach_replay
            return run_attach_replay(trace, headless=headless, output=output, speed=speed, theme=theme,
                                     export_workload_to=export_workload)
        if export_workload is not None:
            raise ConfigError("--export-workload", f"{path} is an engine session: only a recording made by "
                                                   "`batchtop attach --record` holds a server's traffic")
        recorded_engine(trace)  # a header that describes no engine exits 2 naming the field
        for warning in trace.warnings:
            note(f"warning: {warning}")
        if headless:  # every event is decoded here, inside the handler: an inconsistent one exits 2
            doc = replay_metrics(trace)
        elif plan is not None:
            from batchtop.tui.export.stepped_replay import SteppedReplay
            source = SteppedReplay(trace, speed=plan.speed)  # the status line says the speed
        else:
            from batchtop.tui.sources.replay import ReplaySource
            source = ReplaySource(trace, speed=speed)
    if plan is not None:
        from batchtop.tui.cli.replay_export import run_replay_export  # Textual loads only here
        run_replay_export(source, plan, theme)
    if headless:
        sys.exit(0 if deliver_json(doc, output) else 1)
    from batchtop.tui.app import BatchtopApp  # Textual loads only here
    sys.exit(BatchtopApp(source, theme=theme).run() or 0)
