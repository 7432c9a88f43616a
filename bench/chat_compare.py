"""Static vs continuous batching on the bundled chat requests with the real model (SmolLM2), and the
output lengths the model chose.

Runs `batchtop compare --model smollm2` (both policies on one loaded model, closed loop: every request
queued at t=0) on the first N bundled chat requests, then one continuous `--headless --record` run of
the same requests for each request's output length (greedy decoding gives both policies the same
answers). Prints throughput, TTFT and padding share side by side, and the length distribution.

    python bench/chat_compare.py --num-requests 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def batchtop(*args: str) -> None:
    out = subprocess.run([sys.executable, "-m", "batchtop.tui", *args], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"batchtop {' '.join(args)} exited {out.returncode}:\n{out.stderr[-3000:]}")


def percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--model", default="smollm2")
    args = p.parse_args()
    n = str(args.num_requests)
    with tempfile.TemporaryDirectory(prefix="batchtop-chat-bench-") as work:
        compare, trace = Path(work) / "compare.json", Path(work) / "run.jsonl"
        batchtop("compare", "--model", args.model, "--num-requests", n, "-o", str(compare))
        batchtop("--headless", "--model", args.model, "--num-requests", n, "--time-scale", "0",
                 "--record", str(trace), "-o", str(Path(work) / "m.json"))
        doc = json.loads(compare.read_text())
        finishes = [e for e in map(json.loads, trace.read_text().splitlines()) if e.get("type") == "finish"]
    s, c = doc["static"], doc["continuous"]
    print(f"{args.model} on the bundled chat requests: {n} requests, closed loop, "
          f"max_num_seqs {c['config']['max_num_seqs']}, {c['config']['dtype']}")
    print(f"{'':<12}{'tok/s':>8}{'TTFT p50 s':>12}{'TTFT p90 s':>12}{'padding':>9}{'slot util':>11}{'steps':>7}")
    for name, m in (("static", s), ("continuous", c)):
        print(f"{name:<12}{m['throughput_tok_s']:>8.1f}{m['ttft_s']['p50']:>12.2f}{m['ttft_s']['p90']:>12.2f}"
              f"{m['padding_share']:>9.1%}{m['slot_utilization']:>11.1%}{m['steps']:>7}")
    print(f"continuous / static throughput = {doc['speedup']:.2f}")
    lengths = [e["num_generated"] for e in finishes]
    cap = max(lengths)
    reasons = {r: sum(e["finish_reason"] == r for e in finishes) for r in ("stop", "length")}
    print(f"output lengths the model chose ({len(lengths)} answers): min {min(lengths)}, p10 {percentile(lengths, .1)}, "
          f"p50 {percentile(lengths, .5)}, p90 {percentile(lengths, .9)}, max {cap}, mean {statistics.fmean(lengths):.0f}; "
          f"ended at EOS {reasons['stop']}, at the cap {reasons['length']}; under 32 tokens: "
          f"{sum(v < 32 for v in lengths)}")


if __name__ == "__main__":
    main()
