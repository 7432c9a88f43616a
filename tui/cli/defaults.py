"""What the commands use when not told: how much each runs, enough to show its lesson and little
enough to finish in a minute or two on an idle 2-core CPU with the default model (docs/headless.md
has the measured times; each command's --help says how to run the larger one), and where the bundled
demo scripts are. Standard library only: the help reads these."""

from __future__ import annotations

from pathlib import Path

DEMOS_DIR = Path(__file__).parent.parent / "demos"  # --script NAME: a bundled demo ('teaching': teaching.json)

# `batchtop --headless` on the bundled workload, paced: 20 s of one core with SmolLM2
HEADLESS_REQUESTS = 48

# `batchtop compare`: every request at once, static then continuous. 24 of the first 64 chat answers
# run to the CPU's 256-token cap, so a static batch of 16 nearly always lasts 256 steps while
# continuous batching refills each slot as its answer ends: 1024 steps against 700 at 64 requests
# (1.67x the CPU time), 1.66x at 128; at 32 only 512 against about 443 (counted from the same
# answers' lengths: a long answer admitted late sets the end). 60 s of one core at 64 requests.
COMPARE_REQUESTS = 64
COMPARE_FULL_REQUESTS = 256  # what --help offers for the fuller comparison

# `batchtop calibrate`: the decode sweep's batch sizes by device. A CPU's engine has 16 slots by
# default, and a batch of 32 prefilled 512 tokens a row every round, the sweep's largest cost: with
# SmolLM2, 1,8,32 asked 161 s of one core, 1,4,16 asks 76 s.
CALIBRATE_BATCHES = {"cpu": "1,4,16", "cuda": "1,8,32"}
CALIBRATE_FULL = "--batches 1,8,32"  # what --help offers on a CPU for the larger sweep
