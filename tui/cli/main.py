"""The `batchtop` command line. Imports no Textual until the dashboard actually starts."""

from __future__ import annotations

import os
import signal
import threading

import click

from batchtop.core_engine.config import PRESETS
from batchtop.core_engine.run.stop import raise_terminated, signal_of, stopped
from batchtop.tui.cli.defaults import (CALIBRATE_BATCHES, CALIBRATE_FULL, COMPARE_FULL_REQUESTS, COMPARE_REQUESTS,
                                       HEADLESS_REQUESTS)
from batchtop.tui.cli.options import SEED, Finite, engine_options, session_options, theme_option
from batchtop.tui.export.options import DEFAULT_FPS as EXPORT_FPS, DEFAULT_SIZE as EXPORT_SIZE

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def sized(**sizes):
    """Fill a command's docstring (its --help) with the default sizes it really runs."""
    def fill(func):
        func.__doc__ = func.__doc__.format(**sizes)
        return func
    return fill


class Batchtop(click.Group):
    """Ctrl-C or SIGTERM outside a run (loading a model, measuring the machine) exits 130 / 143 with
    one line, not click's "Aborted!"; during a run the driver stops at a step boundary instead. Before
    this module is even imported, tui/__main__.py (the console script) says the same."""

    def make_context(self, *args, **kwargs) -> click.Context:
        try:  # click turns a KeyboardInterrupt while it parses into "Aborted!" and exit 1
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt as exc:
            stopped(signal_of(exc))

    def invoke(self, ctx: click.Context):
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, raise_terminated)
            # Python leaves SIGINT ignored when it starts so (a `cmd &` job of a script), though a run
            # catches it anyway (session.stop): say the same before and after the run
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            stopped(signal_of(exc))


@click.group(cls=Batchtop, invoke_without_command=True, context_settings=CONTEXT)
@engine_options
@session_options
@theme_option
@click.option("--headless", is_flag=True,
              help="No screen: run the workload to completion and write the metrics JSON (schema batchtop.metrics/1). "
                   f"The bundled workload: its first {HEADLESS_REQUESTS} requests, paced as the dashboard paces "
                   "it (under a minute on an idle 2-core CPU; --num-requests N for more); stderr counts them "
                   "down with an ETA.")
@click.option("-o", "--output", type=str, default=None, metavar="FILE",
              help="--headless: write the metrics JSON here instead of stdout.")
@click.version_option(package_name="batchtop")
@click.pass_context
def main(ctx: click.Context, headless: bool, output: str | None, theme: str, **opts) -> None:
    """See how an LLM inference engine batches: a real paged-KV continuous batcher, live.

    With no command, opens the dashboard on the default workload (the bundled Azure conversation
    trace sample) and the default model for this device. Keys there: s static/continuous,
    +/- max_num_seqs, space pause, ? help.
    """
    if ctx.invoked_subcommand is not None:
        return
    if headless:
        from batchtop.tui.cli.headless import run_headless
        run_headless(opts, output)
    else:
        from batchtop.tui.cli.dashboard import run_dashboard
        run_dashboard(opts, theme=theme)


@main.command(context_settings=CONTEXT)
@engine_options
@click.option("-o", "--output", type=str, default="batchtop-compare.json", show_default=True, metavar="FILE",
              help="Where to write the batchtop.compare/1 JSON ('-' for stdout; the table then goes to stderr).")
@sized(requests=COMPARE_REQUESTS, full=COMPARE_FULL_REQUESTS)
def compare(output: str, **opts) -> None:
    """Run one workload under static, then continuous batching, and print the difference.

    Same seed, same request lengths, same model. Arrivals default to all-at-once (--time-scale 0), so the
    comparison measures throughput, not the arrival rate, and the workload to its first {requests}
    requests (about a minute on an idle 2-core CPU); --num-requests {full} runs the fuller comparison
    (about four times as long).
    """
    from batchtop.tui.cli.compare import run_compare
    run_compare(opts, output)


API_KEY_ENV = "BATCHTOP_API_KEY"


def _api_key(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """click reads an empty BATCHTOP_API_KEY as unset, which would serve without auth: refuse it too."""
    from batchtop.core_engine.errors import ConfigError
    from batchtop.core_engine.serve.limits import check_api_key
    source = ctx.get_parameter_source(param.name)
    where = API_KEY_ENV if source is click.core.ParameterSource.ENVIRONMENT else "--api-key"
    if value is None and os.environ.get(API_KEY_ENV) is not None:
        value, where = os.environ[API_KEY_ENV], API_KEY_ENV
    try:
        return check_api_key(value, where)
    except ConfigError as exc:
        raise click.BadParameter(str(exc).removeprefix(f"{where}: "), ctx, param) from None


@main.command(context_settings=CONTEXT)
@engine_options
@session_options
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback exposes the engine to the network.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="0 picks a free port.")
@click.option("--api-key", default=None, envvar=API_KEY_ENV, show_envvar=True, callback=_api_key,
              help="Require `Authorization: Bearer KEY` on every route but /health and /metrics (printable "
                   "ASCII, no spaces; an empty key is refused).")
@click.option("--served-model-name", default=None, metavar="NAME",
              help="The model name clients send and /v1/models lists. [default: the model preset's name]")
@click.option("--max-waiting", type=click.IntRange(min=1), default=None,
              help="Answer 503 + Retry-After while this many requests wait. [default: unbounded]")
@click.option("--shutdown-grace", type=Finite(0, 600), default=5.0, show_default=True,
              help="Seconds in-flight requests get to finish on Ctrl-C / SIGTERM before they are ended.")
@click.option("--headless", is_flag=True, help="No dashboard: serve, and log a one-line summary every 5 s.")
@theme_option
def serve(host: str, port: int, api_key: str | None, served_model_name: str | None, max_waiting: int | None,
          shutdown_grace: float, headless: bool, theme: str, **opts) -> None:
    """Serve the engine over HTTP, OpenAI-compatible, with vLLM-named /metrics.

    POST /v1/completions and /v1/chat/completions (streaming as server-sent events), GET /v1/models,
    /health and /metrics. By default the dashboard opens with the server inside it, so any OpenAI
    client or load generator drives the panels; --workload replays a workload beside the clients.
    """
    from batchtop.tui.cli.serve import ServeOptions, run_serve
    run_serve(opts, ServeOptions(host, port, api_key, served_model_name, max_waiting, shutdown_grace, headless,
                                 theme))


@main.command(context_settings=CONTEXT)
@click.argument("trace", metavar="TRACE")
@click.option("--headless", is_flag=True, help="No screen: recompute the metrics JSON from the trace.")
@click.option("-o", "--output", type=str, default=None, metavar="FILE", help="--headless: metrics JSON file (default stdout).")
@click.option("--speed", type=Finite(0.25, 16), default=1.0, show_default=True,
              help="Playback speed (< and > change it live); --export: how fast the exported file plays.")
@click.option("--export-workload", type=str, default=None, metavar="FILE.jsonl",
              help="An attach recording only: write the traffic it saw as a workload (no dashboard).")
@click.option("--export", type=str, default=None, metavar="FILE.cast|FILE.svg",
              help="No screen: draw the dashboard over the whole recording, at its recorded times, into an "
                   "asciicast v2 (.cast: asciinema play, asciinema.org) or an animated SVG (.svg: a browser, "
                   "a README).")
@click.option("--export-size", type=str, default=EXPORT_SIZE, show_default=True, metavar="COLSxROWS",
              help="--export: the terminal size the dashboard is drawn at.")
@click.option("--export-fps", type=Finite(0.25, 30), default=EXPORT_FPS, show_default=True,
              help="--export: frames per second of the exported file (unchanged frames are dropped).")
@theme_option
def replay(trace: str, headless: bool, output: str | None, speed: float, theme: str,
           export_workload: str | None, export: str | None, export_size: str, export_fps: float) -> None:
    """Replay a recorded session (from --record) in the dashboard, or recompute its metrics.

    Keys: space pause, < / > slower / faster (0.25x..16x), n next step, g / G start / end.
    """
    from batchtop.tui.cli.replay import run_replay
    run_replay(trace, headless=headless, output=output, speed=speed, theme=theme, export_workload=export_workload,
               export=export, export_size=export_size, export_fps=export_fps)


@main.command(context_settings=CONTEXT)
@click.option("-o", "--output", type=str, default="batchtop-calibration.json", show_default=True, metavar="FILE",
              help="Where to write the calibration JSON ('-' for stdout); use it with --simulate --calibration FILE.")
@click.option("--model", type=click.Choice(["auto", *PRESETS]), default="auto", show_default=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
              show_default=True)
@click.option("--batches", default="auto", show_default=True,
              help=f"Batch sizes of the decode sweep; auto: {CALIBRATE_BATCHES['cpu']} on a CPU (its 16 slots), "
                   f"{CALIBRATE_BATCHES['cuda']} on CUDA.")
@click.option("--context", default="128,512", show_default=True,
              help="Tokens of context per sequence, one sweep at each; two lengths tell attention's KV read "
                   "from the GEMMs' per-row work (one: the attention efficiency keeps its default).")
@click.option("--steps", type=click.IntRange(min=2), default=8, show_default=True,
              help="Measured decode steps per batch size, context and round.")
@click.option("--rounds", type=click.IntRange(1, 50), default=3, show_default=True,
              help="Rounds of --steps decode steps at every batch size and context, one step of each in turn "
                   "(each point starts over from its context every round); each one's mean step is fitted "
                   "(steps over 3x its median, a neighbour's burst, left out).")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--from-trace", type=str, default=None, metavar="TRACE",
              help="Fit to the steps of a recorded session (from --record, on any device) instead of measuring here.")
@sized(full=CALIBRATE_FULL)
def calibrate(output: str, **opts) -> None:
    """Fit the what-if model (compute, memory and attention efficiency, per-step overhead) to measured steps.

    Runs a short decode sweep on this device, every batch size at each context, and least-squares fits
    each step's measured time to its GEMMs' time, max(weight FLOPs / (peak x compute eff), weight and
    activation bytes / (peak B/s x memory eff)), plus its attention's, max(attention FLOPs / (peak x
    compute eff), KV bytes / (peak B/s x attention eff)), + overhead. Run it on a quiet machine: a busy
    neighbour slows every step it measures. With SmolLM2 on a 2-core CPU the default sweep takes about 75 s
    of CPU time (one core's; less wall time when both are idle); {full} sweeps further (about twice that).
    """
    from batchtop.tui.cli.calibrate import run_calibrate
    run_calibrate(opts, output)


@main.command("export-checkpoint", context_settings=CONTEXT)
@click.argument("out_dir", metavar="DIR")
@click.option("--model", type=str, default="cpu-demo", show_default=True, metavar="PRESET|smollm2|FILE.gguf",
              help=f"The preset ({', '.join(PRESETS)}) to export, or a GGUF model to dequantize.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="The engine's weight seed (--seed there).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True,
              help="Weights on disk; float32 is exact for the engine at any dtype.")
def export_checkpoint(out_dir: str, model: str, seed: int, dtype: str) -> None:
    """Write a preset, or a GGUF model dequantized, as a Hugging Face model directory (new or empty DIR).

    A preset's weights are the ones the engine draws for that preset and seed (on the CPU), with config.json,
    generation_config.json and a byte-level BPE tokenizer; a GGUF file's (--model smollm2 or FILE.gguf) are
    its weights dequantized, with its own tokenizer, chat template and end-of-turn ids. transformers, vLLM
    and `--model DIR` then all run exactly the weights batchtop runs.
    """
    from batchtop.tui.cli.export import run_export
    run_export(out_dir, model, seed, dtype)


@main.command(context_settings=CONTEXT)
@click.argument("urls", nargs=-1, required=True, metavar="URL [URL ...]")
@click.option("--interval", type=Finite(0.05, 3600), default=1.0, show_default=True,
              help="Seconds between scrapes of every URL.")
@click.option("--window", type=Finite(1), default=30.0, show_default=True,
              help="Seconds of histogram buckets behind each percentile on screen (headless: the whole run).")
@click.option("--timeout", type=Finite(0.01), default=None,
              help="Seconds a scrape may take before its replica is STALE. [default: 0.8 x --interval]")
@click.option("--record", type=str, default=None, metavar="FILE",
              help="Record every scrape as a trace (\"source\": \"attach\"); `batchtop replay FILE` plays it.")
@click.option("--headless", is_flag=True, help="No screen: watch for --duration seconds, write batchtop.attach/1 JSON.")
@click.option("--duration", type=Finite(0), default=None, metavar="S", help="--headless: seconds to watch.")
@click.option("-o", "--output", type=str, default=None, metavar="FILE", help="--headless: JSON file (default stdout).")
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=None,
              help="The servers' slot ceiling, when they do not expose it (vLLM and SGLang do not).")
@click.option("--device", type=str, default=None, metavar="NAME",
              help="The servers' GPU for the roofs (h200, h100, a100, l4, ... or cpu). [default: NVML on this host]")
@click.option("--model", type=str, default=None, metavar="PRESET|DIR",
              help="The served model's dims: estimates the roofline point when the server has no FLOP counters.")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16", show_default=True,
              help="The served weights' dtype, for the estimate and the roofs.")
@click.option("--export-workload", type=str, default=None, metavar="FILE.jsonl",
              help="At the end of the watch, write the traffic the servers saw as a workload for "
                   "`batchtop compare --simulate DEVICE --workload FILE.jsonl`.")
@click.option("--vllm-log", type=str, default=None, metavar="FILE|-",
              help="The server's log, for each engine step: a file to follow, or - for a pipe "
                   "(`vllm serve ... --enable-logging-iteration-details 2>&1 | batchtop attach URL --vllm-log -`). "
                   "SGLang's batch lines are read too.")
@click.option("--kv-events", type=str, default=None, metavar="tcp://HOST:PORT",
              help="Subscribe to the server's KV events (vLLM's and SGLang's --kv-events-config ZMQ publisher): "
                   "the KV panel draws its prefix cache.")
@click.option("--kv-replay", type=str, default=None, metavar="tcp://HOST:PORT",
              help="The publisher's replay endpoint, to fill a gap in the events. [default: --kv-events' port + 1]")
@click.option("--model-params", type=Finite(1.0, 1e15), default=None, metavar="N",
              help="The served model's parameter count, to place logged steps on the roofline when batchtop "
                   "cannot read its dims (--model, or the server's model directory).")
@click.option("--metrics-only", is_flag=True,
              help="A batchtop server: its /metrics panels, as for any server, not its engine's own panels.")
@click.option("--api-key", default=None, envvar=API_KEY_ENV, show_envvar=True, callback=_api_key,
              help="A batchtop server's API key: its engine's step stream is behind it (/metrics is not).")
@theme_option
def attach(urls: tuple[str, ...], theme: str, **opts) -> None:
    """Watch live vLLM, SGLang, TGI, llama.cpp, LMDeploy, NIM, TensorRT-LLM or batchtop servers.

    URL is a server's base URL (/metrics is appended); several URLs are data-parallel replicas, shown
    one row each with their aggregate and the replica that is out of line. Keys: p screenshot, t theme, q quit.
    One batchtop serve URL shows its engine's own panels (slots, KV blocks, waiting, roofline) from its
    step stream (/batchtop/steps), read-only; --metrics-only shows the /metrics panels instead.
    """
    from batchtop.tui.cli.attach import AttachOptions, run_attach
    run_attach(urls, AttachOptions(**opts, theme=theme))


@main.command(context_settings={**CONTEXT, "ignore_unknown_options": True})
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback exposes the dashboard, and the command every "
                   "tab runs, to the network.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="0 picks a free port.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="[-- ARGS...]")
def web(host: str, port: int, args: tuple[str, ...]) -> None:
    """Serve the dashboard to browsers (textual-serve): every tab runs `batchtop ARGS`, keys as in a terminal.

    With no ARGS each tab opens the dashboard on its own engine: one viewer's demo. Every tab is its own
    process, so for one engine and many viewers run `batchtop serve` once (on 8000) and
    `batchtop web -- attach http://127.0.0.1:8000`; `-- replay TRACE` plays a recording in
    every tab.
    """
    from batchtop.tui.cli.web import run_web
    run_web(main, host, port, args)
