"""`batchtop --headless`: run the workload to completion, write the metrics JSON, exit 0/1/2/130."""

from __future__ import annotations

import signal
import sys
import traceback
from collections.abc import Callable

import click

from batchtop.core_engine.perf.device_peaks import DevicePeaks, device_peaks
from batchtop.core_engine.model.gguf_quant_weights import slow_blocks_note
from batchtop.core_engine.model.weight_bytes import weights_text
from batchtop.core_engine.perf.metrics import finite
from batchtop.core_engine.perf.isa_peak import isa_record
from batchtop.core_engine.perf.raised_roofs import RoofRaiser
from batchtop.core_engine.run.resolve import pool_note
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.run.headless import RunResult, run_workload
from batchtop.core_engine.run.live_session import Session
from batchtop.core_engine.run.stop import exit_status
from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.tui.cli.defaults import HEADLESS_REQUESTS
from batchtop.tui.cli.options import EXIT_ENGINE_FAILURE, bad_input_exits
from batchtop.tui.cli.run_setup import Setup, build_setup
from batchtop.core_engine.output_files import OutputError, deliver_json
from batchtop.tui.cli.progress import StderrProgress
from batchtop.gpu_kernels import cpu_kernels


def note(message: str) -> None:
    click.echo(f"batchtop: {message}", err=True)


def note_written(schema: str, path: str | None) -> None:
    """A command whose table takes stdout names, on stderr, the file its JSON went to (none for stdout)."""
    if path not in (None, "-"):
        note(f"wrote the {schema} JSON to {path}")


def build_engine(setup: Setup, say: Callable[[str], None] = note) -> Engine:
    """say: where to tell what is being built (stderr; the dashboard's status line while it loads)."""
    c = setup.config
    sim = setup.simulation
    capped = pool_note(c)
    if sim is not None:
        note(f"simulating {c.model.name} ({c.model.num_params() / 1e6:.3g}M params, {c.dtype}) on "
             f"{sim.device.label}: no model runs, each step's time comes from the roofline model; "
             f"{c.num_kv_blocks} KV blocks x {c.block_size} tokens; {len(setup.requests)} requests")
        if capped:
            note(capped)
        note(f"calibration: {sim.calibration.describe()}")
        if sim.lengths_note(c):
            note(sim.lengths_note(c))
        if sim.mismatch():
            note(f"warning: {sim.mismatch()}")
        return sim.engine(c)
    verb = "building" if c.model.checkpoint is None else f"loading {c.model.checkpoint}:"
    dtype = weights_text(c.model, c.dtype)
    say(f"{verb} {c.model.name} ({c.model.num_params() / 1e6:.3g}M params, {dtype}) on {c.device}; "
        f"{c.num_kv_blocks} KV blocks x {c.block_size} tokens; {len(setup.requests)} requests")
    if capped:
        say(capped)
    if (slow := slow_blocks_note(c.model, c.device, c.dtype)) is not None:
        say(slow)
    if say is note:
        with bad_input_exits():  # a tensor the header promised but the file cannot deliver
            engine = Engine(c)
    else:
        engine = Engine(c)  # the dashboard reports bad input itself, once its screen is closed
    if engine.config.extra.get("kv_pool"):  # a GPU's pool, sized after a profiling forward
        say(engine.config.extra["kv_pool"])
    building = cpu_kernels.background_state() is not None  # the dashboard's status line follows that build
    if c.device == "cpu" and not building and not cpu_kernels.available():
        say(f"CPU kernels unavailable ({cpu_kernels.why_unavailable()}): attention and the elementwise "
            "steps run as plain torch ops, slower")
    return engine


def pace_workload(setup: Setup, engine: Engine, say: Callable[[str], None] = note) -> Setup:
    """The bundled workload's closed-loop pace, installed on the engine before its workload is loaded."""
    setup = setup.paced(engine)
    if setup.pacer is not None:
        say(f"pacing: {setup.spec.pace_note} (--time-scale plays the recorded times instead)")
    return setup


def load_peaks(setup: Setup) -> DevicePeaks:
    c = setup.config
    peaks = setup.simulation.peaks if setup.simulation is not None else device_peaks(c.device, c.dtype)
    note(f"roofs: {peaks.roofs_text()} ({peaks.source})")
    return peaks


def run_roofs(setup: Setup, peaks: DevicePeaks) -> RoofRaiser | None:
    """The roofs a run's steps raise where they beat them (measured ones; a what-if's are the model's)."""
    return RoofRaiser.for_run(peaks, setup.config.device, setup.config.dtype) if setup.simulation is None else None


def note_raised(roofs: RoofRaiser | None) -> None:
    """Where the run's steps beat the roofs it started with, what they end at (the JSON's fractions')."""
    if roofs is not None and roofs.raised:
        which = [f"{name} {origin.raise_words()}" for name, origin in
                 (("compute", roofs.compute), ("memory", roofs.memory)) if origin.raised_step is not None]
        note(f"roofs raised by the steps that beat them: {roofs.peaks.roofs_text()} ({', '.join(which)})")


def warn_rejections(snap: StepSnapshot) -> None:
    for _, reason in snap.rejected:
        note(f"warning: rejected {reason}")


def run_and_report(engine: Engine, setup: Setup, label: str = "", session: Session | None = None,
                   roofs: RoofRaiser | None = None) -> RunResult:
    progress = StderrProgress(setup.requests, label=label)

    def on_step(snap: StepSnapshot) -> None:
        warn_rejections(snap)
        progress.update(snap)
        if roofs is not None:
            roofs.observe(snap)

    result = run_workload(engine, setup.requests, session, on_step=on_step)
    progress.close()
    return result


def metrics_document(result: RunResult, setup: Setup, config_dict: dict, peaks: DevicePeaks | None,
                     roofs: RoofRaiser | None = None) -> dict:
    """roofs: the run's, raised where its steps beat them: the fractions are against what they ended at."""
    if roofs is not None:
        peaks = roofs.peaks
    doc = result.collector.summary(config_dict, complete=result.complete, workload=setup.workload_record(),
                                   peaks=peaks, roofs=roofs.as_dict() if roofs is not None else None)
    if setup.simulation is not None:
        doc["simulated"] = setup.simulation.as_dict()
    if result.error is not None:
        doc["error"] = f"{type(result.error).__name__}: {result.error}"
    elif result.interrupted:
        doc["error"] = "interrupted"
        doc["interrupted_by"] = signal.Signals(result.signal).name
    elif result.stopped_by_script:
        doc["stopped_by"] = "script"
    return finite(doc)


def exit_code(result: RunResult) -> int:
    if isinstance(result.error, OutputError):  # a full disk under the trace: its message says it all
        note(f"error: {result.error}; metrics cover what finished before it (complete: false)")
        return EXIT_ENGINE_FAILURE
    if result.error is not None:
        note("engine failure: " + "".join(traceback.format_exception(result.error)).rstrip())
        return EXIT_ENGINE_FAILURE
    if result.interrupted:
        note(f"interrupted by {signal.Signals(result.signal).name}: metrics cover what finished so far "
             "(complete: false)")
        return exit_status(result.signal)
    return 0


def headless_defaults(opts: dict) -> dict:
    """A plain `--headless` runs the bundled workload's first HEADLESS_REQUESTS requests, not all of them:
    a run that says how long it takes and ends within a minute on an idle 2-core CPU (a what-if run, in
    modelled time, keeps all)."""
    if opts.get("workload_path") is None and opts.get("num_requests") is None and opts.get("simulate") is None:
        note(f"running the bundled workload's first {HEADLESS_REQUESTS} requests (the --headless default; "
             "--num-requests N for more)")
        return {**opts, "num_requests": HEADLESS_REQUESTS}
    return opts


def run_headless(opts: dict, output: str | None) -> None:
    opts = headless_defaults(opts)
    with bad_input_exits():
        setup = build_setup(opts, output="-" if output is None else output)  # no -o: stdout
    engine = build_engine(setup)
    setup = pace_workload(setup, engine)
    peaks = load_peaks(setup)
    roofs = run_roofs(setup, peaks)
    with bad_input_exits():
        session = setup.open_session(engine, peaks, isa_peaks=isa_record(roofs.isa) if roofs is not None else None)
    result = run_and_report(engine, setup, session=session, roofs=roofs)
    if session.recorder is not None:
        note(session.recorder.outcome())
    note_raised(roofs)
    written = deliver_json(metrics_document(result, setup, engine.config.as_dict(), peaks, roofs), output)
    code = exit_code(result)
    sys.exit(code or (0 if written else EXIT_ENGINE_FAILURE))
