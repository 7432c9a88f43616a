"""What following a server's step log and KV events costs attach, in CPU: `batchtop attach --headless`
over a stand-in vLLM made of the real 0.32.0 capture (tests/data/vllm-0.32-cpu-step-streams), once
scraping /metrics alone and once with --vllm-log and --kv-events while the log grows by --rate lines a
second and the publisher sends --rate messages a second; rounds alternate, each in its own process.

    python bench/attach_stream_cpu.py [--seconds 20] [--rate 100] [--rounds 2]

Prints each run's CPU time (user + system, the process and its threads, startup included) over its
wall time, and the streams' share: (with streams - without) / seconds, as % of one core. Goal: < 10%.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the stand-in lives with the tests' support
from tests.support.step_stream_server import step_stream_server  # noqa: E402


def child_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(seconds: float, rate: float, streams: bool) -> tuple[float, dict]:
    """CPU seconds of one attach process, and its JSON."""
    with tempfile.TemporaryDirectory() as tmp, step_stream_server(Path(tmp), lines_per_s=rate, messages_per_s=rate,
                                                                  start_after_s=0.0, seconds=seconds + 30) as server:
        out = Path(tmp) / "attach.json"
        cmd = [sys.executable, "-m", "batchtop.tui", "attach", server.url, "--headless", "--duration", str(seconds),
               "--interval", "1", "--device", "h100", "--max-num-seqs", "8", "-o", str(out)]
        if streams:
            cmd += ["--vllm-log", str(server.log_path), "--kv-events", server.kv_endpoint,
                    "--kv-replay", server.replay_endpoint]
        server.start()
        before = child_cpu_s()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return child_cpu_s() - before, json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=100.0, help="log lines and KV messages a second")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not (args.seconds > 0 and args.rate > 0 and args.rounds >= 1):
        parser.error("--seconds and --rate must be > 0, --rounds >= 1")
    print(f"attach over a stand-in vLLM, {args.seconds:g} s each, {args.rate:g} lines/s and messages/s, "
          f"{os.cpu_count()} CPUs")
    shares = []
    for r in range(args.rounds):
        plain, _ = run_once(args.seconds, args.rate, streams=False)
        followed, doc = run_once(args.seconds, args.rate, streams=True)
        steps = doc["streams"]["step_log"]["steps"]
        cached = doc["streams"]["prefix_cache"]["cached_blocks"]
        share = (followed - plain) / args.seconds
        shares.append(share)
        print(f"round {r + 1}: /metrics alone {plain:.2f} s CPU ({100 * plain / args.seconds:.1f}% of a core), "
              f"with the streams {followed:.2f} s ({100 * followed / args.seconds:.1f}%): the streams "
              f"{100 * share:.1f}% of a core; {steps} steps ({steps / args.seconds:.0f}/s), {cached} blocks cached")
    print(f"streams' cost, median of {len(shares)}: {100 * sorted(shares)[len(shares) // 2]:.1f}% of one core "
          f"(goal < 10%)")


if __name__ == "__main__":
    main()
