"""`batchtop` with no subcommand: the live dashboard. Its panels come up as soon as the options are
checked; the model loads (and, on a CPU, the C++ kernels build) while they show what is happening."""

from __future__ import annotations

import os
import signal
import sys

from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.model.weight_bytes import weights_text
from batchtop.core_engine.perf.telemetry import TelemetrySampler
from batchtop.core_engine.run.playback_speed import WallPace
from batchtop.core_engine.simulate.clock import VirtualClock
from batchtop.core_engine.torch_thread import call_in_thread
from batchtop.gpu_kernels import cpu_kernels
from batchtop.tui.cli.flags import user_message
from batchtop.tui.cli.headless import build_engine, load_peaks, pace_workload
from batchtop.tui.cli.options import EXIT_BAD_INPUT, bad_input_exits, fail
from batchtop.tui.cli.run_setup import Setup, build_setup


def run_dashboard(opts: dict, *, theme: str = "batchtop-dark", start_paused: bool = False) -> None:
    with bad_input_exits():
        setup = build_setup(opts)
    kernels = setup.config.device == "cpu" and setup.simulation is None
    if kernels:
        cpu_kernels.start_background()  # built beside the torch ops, switched in between two steps
    # The main thread will draw; it must never run a torch parallel region (see core_engine.torch_thread)
    peaks = call_in_thread(lambda: load_peaks(setup))
    from batchtop.tui.app import QUIT_WAIT_S, BatchtopApp  # Textual loads only here, never on the headless path
    from batchtop.tui.sources.preparing import PreparingSource
    from batchtop.tui.sources.source import EngineInfo

    telemetry = TelemetrySampler(setup.config.device) if setup.simulation is None else None
    sim = setup.simulation
    label = f"{sim.device.label} (simulated)" if sim is not None else peaks.device_name if peaks else setup.config.device
    info = EngineInfo(setup.config, peaks, label, simulation=sim, workload=setup.workload_record(),
                      telemetry=telemetry)
    source = PreparingSource(info, lambda say: prepare(setup, peaks, telemetry, say, start_paused), kernels=kernels)
    # The recording opens on the worker thread once the engine is built; whatever ends the process from
    # here (q, SIGTERM before the app has drawn or while its engine thread is still in a step, SIGINT)
    # closes it with its end event.
    reason = "interrupted"
    try:
        code = BatchtopApp(source, theme=theme).run()
        reason = "error" if source.error is not None else "quit"
    finally:
        source.shut_down(reason, QUIT_WAIT_S)
        cpu_kernels.stop_background()
    if code and code > 128:  # ended by a signal: the one line, as before the screen was up (run.stop)
        print(f"batchtop: stopped by {signal.Signals(code - 128).name}", file=sys.stderr, flush=True)
        if source.preparing:  # the model still builds on its thread, inside torch: out at once
            sys.stdout.flush()
            os._exit(code)
    if source.failure is not None:  # the app has closed: say why on the terminal too
        exit_code, message = source.failure
        fail(message, exit_code)
    sys.exit(code or 0)


def loading_message(setup: Setup) -> str:
    c, sim = setup.config, setup.simulation
    params = f"{c.model.num_params() / 1e6:.3g}M params"
    if sim is not None:
        return f"setting up the what-if run of {c.model.name} ({params}) on {sim.device.label}"
    if c.model.weights == "quantized":
        return f"loading {c.model.name} ({params}, {weights_text(c.model, c.dtype)})"
    if c.model.quantization:
        return f"loading {c.model.name} ({params}): dequantizing {c.model.quantization} to {c.dtype}"
    if c.model.checkpoint is not None:
        return f"loading {c.model.name} ({params}, {c.dtype})"
    return f"building {c.model.name} ({params}, random weights, {c.dtype})"


def prepare(setup: Setup, peaks, telemetry: TelemetrySampler | None, say, start_paused: bool):
    """On the app's worker thread: the engine, its pace and its session, as a live frame source."""
    from batchtop.tui.sources.live import EngineSource
    from batchtop.tui.sources.preparing import PrepareFailed

    say(loading_message(setup))
    try:
        engine = build_engine(setup, say=lambda message: None)  # the status line follows the kernels itself
    except BadInput as exc:
        raise PrepareFailed(EXIT_BAD_INPUT, user_message(exc)) from None
    setup = pace_workload(setup, engine, say=say)
    try:  # a what-if run computes no real tokens: there are no words to show
        session = setup.open_session(engine, peaks, show_text=setup.simulation is None)
    except BadInput as exc:  # a --record whose header cannot be written
        raise PrepareFailed(EXIT_BAD_INPUT, user_message(exc)) from None
    workload = setup.workload_record()
    if setup.simulation is not None:
        clock = engine.clock
        assert isinstance(clock, VirtualClock), "a simulated engine keeps simulated time"
        return EngineSource(engine, session=session, peaks=peaks, simulation=setup.simulation, pace=WallPace(clock),
                            workload=workload, start_paused=start_paused)
    return EngineSource(engine, session=session, peaks=peaks, telemetry=telemetry, workload=workload,
                        start_paused=start_paused, live_roofs=True)
