"""`batchtop` with no subcommand: build the engine, then run the live dashboard over it."""

from __future__ import annotations

import sys

from batchtop.core_engine.perf.telemetry import TelemetrySampler
from batchtop.core_engine.run.pace import WallPace
from batchtop.core_engine.simulate.clock import VirtualClock
from batchtop.core_engine.torch_thread import call_in_thread
from batchtop.tui.cli.headless import build_engine, load_peaks, pace_workload
from batchtop.tui.cli.options import bad_input_exits, build_setup, workload_info


def run_dashboard(opts: dict, *, theme: str = "batchtop-dark", start_paused: bool = False) -> None:
    with bad_input_exits():
        setup = build_setup(opts)
    # The main thread will draw; it must never run a torch parallel region (see core_engine.torch_thread)
    def build():
        engine = build_engine(setup)
        return engine, pace_workload(setup, engine), load_peaks(setup)

    engine, setup, peaks = call_in_thread(build)
    from batchtop.tui.app import QUIT_WAIT_S, BatchtopApp  # Textual loads only here, never on the headless path
    from batchtop.tui.sources.live import EngineSource

    # The recording opens last, and whatever ends the process from here (q, SIGTERM before the app
    # has drawn or while its engine thread is still in a step, SIGINT) closes it with its end event.
    # A what-if run computes no real tokens: there are no words to show.
    session = setup.open_session(engine, peaks, show_text=setup.simulation is None)
    workload = workload_info(setup.spec, setup.requests)
    source = None
    reason = "interrupted"
    try:
        if setup.simulation is not None:
            clock = engine.clock
            assert isinstance(clock, VirtualClock), "a simulated engine keeps simulated time"
            source = EngineSource(engine, session=session, peaks=peaks, simulation=setup.simulation,
                                  pace=WallPace(clock), workload=workload, start_paused=start_paused)
        else:
            source = EngineSource(engine, session=session, peaks=peaks,
                                  telemetry=TelemetrySampler(setup.config.device), workload=workload,
                                  start_paused=start_paused)
        code = BatchtopApp(source, theme=theme).run()
        reason = "error" if source.error is not None else "quit"
    finally:
        if source is not None:
            source.shut_down(reason, QUIT_WAIT_S)
        elif session.recorder is not None:
            session.close(reason)
    sys.exit(code or 0)
