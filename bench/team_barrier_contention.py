"""Decode step time of the thread team (run_team, team_barrier.h) when its cores are shared, at 1 and 2 threads.

    python bench/team_barrier_contention.py [--model smollm2] [--weights quantized] [--rounds 3]
        [--batch 8] [--context 64] [--steps 48] [--library DIR ...] [--scenarios quiet,hog,taskset]

Scenarios: `quiet` (whatever else the host runs), `hog` (a busy `sh` loop pinned to each CPU this
process may use, started before the engine and killed after it), `taskset` (the engine pinned to the
first of them with `taskset -c`, torch at 2 threads). Any of them with `-passive` (`hog-passive`) runs
with OMP_WAIT_POLICY=PASSIVE: libgomp's idle threads and its own regions' barriers (the lm_head's, the
sampler's, the team region's start and end) sleep at once instead of spinning first.

Each (library, scenario) is one child process that loads the model once and decodes `batch` sequences
for `steps` steps at 1 and at 2 threads, the order alternating by round; the libraries (built library
directories, e.g. ~/.cache/torch_extensions/py311_cpu/batchtop_cpu_kernels-KEY of two checkouts;
default: this checkout's build) alternate too, so each meets the same minutes of a shared host.
Printed per scenario and library: step p50 / p99 at each thread count over all rounds, and the ratio
of the 2-thread to the 1-thread p50, per round and overall (> 1: two threads are slower than one).
Compare libraries by their ratios: on a shared 2-core host "quiet" is never quiet.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HOG_S = 900  # a hog outlives no bench run by more than this, whatever happens to this process
CHILD_TIMEOUT_S = 600


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- the child: one library, one scenario, both thread counts ---------------------------------------------
def child(args: argparse.Namespace) -> None:
    from batchtop.gpu_kernels import cpu_kernel_build, cpu_kernels
    if args.library:  # cpu_kernels imported build_dir by name: patch that one too, before anything loads it
        directory = Path(args.library)
        cpu_kernel_build.build_dir = cpu_kernels.build_dir = lambda key=None: directory
    import torch
    from batchtop.core_engine.engine.engine import Engine
    from batchtop.core_engine.perf.decode_sweep import decode_steps
    from batchtop.core_engine.run.resolve import resolve_config
    config = resolve_config(model=args.model, weights=args.weights, max_num_seqs=args.batch,
                            max_num_batched_tokens=args.batch * args.context, num_kv_blocks=1024)
    runner = None
    for threads in args.threads:
        torch.set_num_threads(threads)
        engine = Engine(config, runner=runner)
        runner = engine.runner
        if not cpu_kernels.active():
            raise SystemExit(f"the CPU kernels are not running: {cpu_kernels.why_unavailable()}")
        steps = decode_steps(engine, args.batch, args.context, args.steps)
        print(json.dumps({"threads": threads, "step_ms": [1e3 * s.step_time_s for s in steps]}), flush=True)


# -- the parent -------------------------------------------------------------------------------------------
def start_hogs(cpus: list[int]) -> list[subprocess.Popen]:
    return [subprocess.Popen(["timeout", str(HOG_S), "taskset", "-c", str(cpu), "sh", "-c", "while :; do :; done"],
                             start_new_session=True) for cpu in cpus]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for hog in hogs:
        if hog.poll() is None:
            os.killpg(hog.pid, signal.SIGKILL)  # its own session: timeout, taskset's sh
        hog.wait()


def run_child(args: argparse.Namespace, library: str, scenario: str, threads: list[int], cpus: list[int]) -> dict:
    command = [sys.executable, __file__, "--child", "--model", args.model, "--weights", args.weights,
               "--batch", str(args.batch), "--context", str(args.context), "--steps", str(args.steps),
               "--threads", ",".join(map(str, threads))]
    if library:
        command += ["--library", library]
    base = scenario.removesuffix("-passive")
    if base == "taskset":
        command = ["taskset", "-c", str(cpus[0])] + command
    env = {**os.environ, "OMP_NUM_THREADS": str(max(threads))}
    if base != scenario:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    hogs = start_hogs(cpus) if base == "hog" else []
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=env,
                              check=False)
    finally:
        stop_hogs(hogs)
    if done.returncode != 0:
        raise SystemExit(f"{scenario} child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    out = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            out[record["threads"]] = record["step_ms"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--weights", default="quantized", choices=("auto", "quantized", "dequantized"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--library", action="append", default=[],
                    help="a built library directory to run (repeat to compare; default: this checkout's)")
    ap.add_argument("--scenarios", default="quiet,hog,taskset")
    ap.add_argument("--threads", default="1,2", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.threads = [int(t) for t in args.threads.split(",")]
    if args.child:
        args.library = args.library[0] if args.library else None
        return child(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the hogs' finally runs
    cpus = sorted(os.sched_getaffinity(0))
    libraries = args.library or [""]
    scenarios = args.scenarios.split(",")
    steps: dict = {}  # (library, scenario, threads) -> every round's step times
    ratios: dict = {}  # (library, scenario) -> each round's 2-thread / 1-thread p50
    print(f"{args.model} {args.weights}, {args.batch} sequences x {args.steps} steps at context {args.context}; "
          f"CPUs {cpus}; load average {os.getloadavg()[0]:.2f}", flush=True)
    for r in range(args.rounds):
        order = libraries if r % 2 == 0 else libraries[::-1]
        threads = [1, 2] if r % 2 == 0 else [2, 1]
        for scenario in scenarios:
            for library in order:
                got = run_child(args, library, scenario, threads, cpus)
                for t, times in got.items():
                    steps.setdefault((library, scenario, t), []).extend(times)
                ratio = statistics.median(got[2]) / statistics.median(got[1])
                ratios.setdefault((library, scenario), []).append(ratio)
                print(f"round {r + 1} {scenario:8s} {Path(library).name or 'this checkout':40s} "
                      f"p50 1t {statistics.median(got[1]):7.1f} ms  2t {statistics.median(got[2]):7.1f} ms  "
                      f"2t/1t {ratio:5.2f}  (load {os.getloadavg()[0]:.2f}, {time.strftime('%H:%M:%S')})",
                      flush=True)
    print(f"\n{'scenario':8s} {'library':40s} {'1t p50':>7s} {'1t p99':>7s} {'2t p50':>7s} {'2t p99':>7s} "
          f"{'2t/1t p50':>9s}  rounds' 2t/1t")
    for scenario in scenarios:
        for library in libraries:
            one, two = steps[(library, scenario, 1)], steps[(library, scenario, 2)]
            rounds = ", ".join(f"{x:.2f}" for x in ratios[(library, scenario)])
            print(f"{scenario:8s} {Path(library).name or 'this checkout':40s} {statistics.median(one):7.1f} "
                  f"{percentile(one, 0.99):7.1f} {statistics.median(two):7.1f} {percentile(two, 0.99):7.1f} "
                  f"{statistics.median(two) / statistics.median(one):9.2f}  {rounds}")


if __name__ == "__main__":
    main()
