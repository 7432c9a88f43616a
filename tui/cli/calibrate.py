"""`batchtop calibrate`: fit the what-if model's five constants to steps measured on this device
(a short decode sweep at two contexts), or to the steps of a session recorded anywhere (--from-trace)."""

from __future__ import annotations

import statistics
import sys

import torch
from rich.console import Console
from rich.table import Table

from batchtop.core_engine.config import MAX_NUM_SEQS_LIMIT
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.kv_cache import cdiv
from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.perf.device_peaks import DevicePeaks, device_peaks
from batchtop.core_engine.run.resolve import resolve_config
from batchtop.core_engine.trace.trace import read_trace
from batchtop.core_engine.trace.schema import HeaderError, engine_header
from batchtop.core_engine.simulate.calibration import CALIBRATION_SCHEMA
from batchtop.core_engine.simulate.calibration_fit import Fit, fit_calibration, predict
from batchtop.core_engine.perf.decode_sweep import (StepSample, decode_sweep, sweep_means, sweep_points,
                                                        typical_seconds)
from batchtop.tui.cli.defaults import CALIBRATE_BATCHES
from batchtop.tui.cli.headless import note, note_written
from batchtop.tui.cli.options import EXIT_BAD_INPUT, bad_input_exits, fail
from batchtop.core_engine.output_files import check_outputs, deliver_json


MIN_MEASURED_S = 1e-9  # a clock's resolution: a recorded step shorter than this was not measured


def parse_lengths(option: str, text: str) -> list[int]:
    """Comma-separated integers >= 1, distinct and sorted; a ConfigError naming `option` otherwise."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise ConfigError(option, f"must be comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise ConfigError(option, f"must all be >= 1, got {text!r}")
    return sorted(set(values))


def parse_batches(text: str) -> list[int]:
    batches = parse_lengths("--batches", text)
    if max(batches) > MAX_NUM_SEQS_LIMIT:
        raise ConfigError("--batches", f"must all be at most {MAX_NUM_SEQS_LIMIT} (the most slots an engine has), "
                                       f"got {text!r}")
    if len(batches) < 2:
        raise ConfigError("--batches", f"needs two or more distinct batch sizes >= 1 (the overhead and the "
                                       f"per-row costs are fitted apart), got {text!r}")
    return batches


def sweep_batches(text: str, device: str) -> list[int]:
    """--batches, 'auto' being the device's default sweep (CALIBRATE_BATCHES)."""
    return parse_batches(CALIBRATE_BATCHES["cpu" if device == "cpu" else "cuda"] if text == "auto" else text)


def measured_sweep(opts: dict, contexts: list[int]) -> tuple[list[StepSample], DevicePeaks, dict]:
    steps = opts["steps"]
    probe = resolve_config(model=opts["model"], device=opts["device"], dtype=opts["dtype"], max_num_seqs=1,
                           max_num_batched_tokens=1, num_kv_blocks=1)
    model, batches = probe.model, sweep_batches(opts["batches"], probe.device)
    if max(contexts) + steps + 1 > model.max_position_embeddings:  # named here, not as a pool too large
        raise ConfigError("--context", f"{max(contexts)} tokens and {steps} --steps pass {model.name}'s "
                                       f"max_model_len {model.max_position_embeddings}")
    # the model's holder: each point of the sweep decodes on a KV pool of its own (decode_sweep)
    config = resolve_config(model=opts["model"], device=opts["device"], dtype=opts["dtype"],
                            max_num_seqs=max(batches), max_num_batched_tokens=max(batches) * max(contexts),
                            num_kv_blocks=cdiv(max(contexts) + steps + 4, 16), seed=opts["seed"])
    note(f"measuring decode steps of {config.model.name} ({config.dtype}) on {config.device} at batch "
         f"{', '.join(map(str, batches))}, context {' and '.join(map(str, contexts))}: {steps} steps each a "
         f"round, {opts['rounds']} rounds, one step of each in turn")
    engine = Engine(config)
    peaks = device_peaks(config.device, config.dtype)
    samples = sweep_means(decode_sweep(engine, batches, contexts, steps, opts["rounds"]))
    return samples, peaks, {"device": peaks.device_name, "model": config.model.name, "dtype": config.dtype,
                            "layers": config.model.num_hidden_layers, "batches": batches, "contexts": contexts,
                            "steps": steps, "rounds": opts["rounds"],
                            "torch": torch.__version__, "threads": torch.get_num_threads()}


def recorded_steps(path: str) -> tuple[list[StepSample], DevicePeaks, dict]:
    trace = read_trace(path)
    if trace.header.get("simulated"):
        raise ConfigError("--from-trace", f"{path}: a simulated session: its step times are modelled, not measured")
    try:
        config, peaks = engine_header(trace.header)
    except HeaderError as exc:
        raise ConfigError("--from-trace", f"{path}:1: {exc}") from None
    if peaks is None:
        raise ConfigError("--from-trace", f"{path}: the trace records no device peaks")
    samples = []
    for i, (_, snap) in enumerate(trace.snapshots()):
        if snap is None or not snap.is_step or snap.step_time_s <= 0:
            continue
        if snap.step_time_s < MIN_MEASURED_S:
            raise ConfigError("--from-trace", f"{path}:{trace.lines[i]}: step event: field times[0] "
                                              f"{snap.step_time_s!r} s is shorter than any clock measures a step "
                                              f"({MIN_MEASURED_S:g} s): not a measured step")
        samples.append(StepSample(snap.num_seqs, snap.cost, snap.step_time_s))
    if len({s.cost for s in samples}) < 2:
        raise ConfigError("--from-trace", f"{path}: needs two or more different steps to fit, has {len(samples)}")
    return samples, peaks, {"device": peaks.device_name, "model": config.model.name,
                            "layers": config.model.num_hidden_layers, "dtype": config.dtype, "trace": path, "steps": len(samples)}


def fit_table(fit: Fit, samples: list[StepSample], peaks: DevicePeaks, layers: int) -> Table:
    table = Table()
    for column in ("batch", "context", "measured ms", "predicted ms", "error"):
        table.add_column(column, justify="right")
    for batch, context in sweep_points(samples):
        mine = [s for s in samples if (s.batch, s.context) == (batch, context)]
        measured, kept = typical_seconds([s.seconds for s in mine])
        predicted = statistics.mean(predict(fit.calibration, s, peaks, layers) for s, k in zip(mine, kept) if k)
        table.add_row(str(batch), "varied" if context is None else str(context), f"{1e3 * measured:.2f}",
                      f"{1e3 * predicted:.2f}", f"{100 * (predicted / measured - 1):+.1f}%")
    return table


def run_calibrate(opts: dict, output: str) -> None:
    with bad_input_exits():
        check_outputs({"--output": output}, {"--from-trace": opts["from_trace"]})
        if opts["from_trace"] is not None:
            samples, peaks, fitted_on = recorded_steps(opts["from_trace"])
        else:
            if opts["batches"] != "auto":  # a bad list fails before the model is read
                parse_batches(opts["batches"])
            samples, peaks, fitted_on = measured_sweep(opts, parse_lengths("--context", opts["context"]))
    try:
        fit = fit_calibration(samples, peaks, source=output, fitted_on=fitted_on, layers=fitted_on["layers"])
    except ValueError as exc:  # steps no model time can fit (all of one size, no work at all)
        fail(f"{'--from-trace' if opts['from_trace'] is not None else 'calibrate'}: {exc}", EXIT_BAD_INPUT)
    for caveat in fit.caveats():  # what these steps could not pin down
        note(caveat)
    doc = {"schema": CALIBRATION_SCHEMA, **fit.calibration.constants(),
           "fitted_on": {**fitted_on, "peaks": fit.calibration.roofs.as_dict()}, "fit": fit.as_dict(),
           "samples": [s.as_dict() for s in samples]}
    if not deliver_json(doc, output):
        sys.exit(1)
    note_written(CALIBRATION_SCHEMA, output)
    console = Console(file=sys.stderr if output == "-" else sys.stdout)
    console.print(f"fitted: {fit.calibration.describe()}", soft_wrap=True, highlight=False)
    console.print(fit_table(fit, samples, fit.calibration.roofs, fitted_on["layers"]))
