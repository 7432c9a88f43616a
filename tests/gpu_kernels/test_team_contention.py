"""The thread team (decoder_team_cpu.cpp: run_team, at its barriers, team_barrier.h) on shared cores: at
1, 3, 8 and 32 threads on this host's CPUs, beside a busy loop on each CPU, and pinned to one CPU, a run
of decode steps over packed layers finishes and computes the same bits at every thread count (the team's
size, and whether a step runs as a team or on one thread, never changes an output element). Each run is
a child process with a generous timeout, so that a hang fails instead of stopping the suite; nothing
here is timed (bench/team_barrier_contention.py measures the speed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from batchtop.gpu_kernels import cpu_kernels, quant_kernels
from batchtop.gpu_kernels.quant_kernels import QUANT_TYPES

pytestmark = pytest.mark.skipif(
    not cpu_kernels.decoder_layer_usable() or not all(quant_kernels.usable(t) for t in QUANT_TYPES),
    reason="needs batchtop's CPU kernels with the bf16 decoder layer and linear_quant")

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300  # a step takes well under a millisecond on a quiet host: only a hang comes near this
HOG_S = 2 * TIMEOUT_S
# Decode steps of 3 sequences over every-linear-packed layers, each step's rows new, the pools carried on;
# prints each thread count's digest of the outputs and pools, as it finishes.
CHILD = """
import hashlib, json, sys
import torch
from batchtop.gpu_kernels import cpu_kernels
from tests.gpu_kernels import test_decoder_layer_quant as q

layers = q.make_layers(layer_types=q.PACKED_TYPES)
weights = [t for norms, linears in layers for t in (*norms, *(u for lin in linears for u in (lin.fused, lin.bias)))]
types = [lin.type_id for _, linears in layers for lin in linears]
for threads in map(int, sys.argv[1].split(",")):
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(2)
    pools = [tuple(torch.randn(65, 4, q.KV_HEADS, q.HEAD_DIM, generator=gen).to(torch.bfloat16) for _ in range(2))
             for _ in layers]
    digest = hashlib.sha256()
    with torch.inference_mode():
        for step in range(40):
            slots, tables, row_tables, lens = q.step_rows([(5 + step, 1), (step, 1), (17 + step, 1)])
            cos, sin = (torch.randn(3, q.HEAD_DIM, generator=gen).to(torch.bfloat16) for _ in range(2))
            x = torch.randn(3, q.HIDDEN, generator=gen).to(torch.bfloat16)
            cpu_kernels.decoder_layers_bf16(x, weights, [k for k, _ in pools], [v for _, v in pools], cos, sin, slots,
                                            tables, row_tables, lens, q.HEADS, q.EPS, q.HEAD_DIM ** -0.5,
                                            linear_types=types)
            assert torch.isfinite(x.float()).all()
            digest.update(x.view(torch.int16).numpy().tobytes())
    for k, v in pools:
        digest.update(k.view(torch.int16).numpy().tobytes() + v.view(torch.int16).numpy().tobytes())
    print(json.dumps({"threads": threads, "digest": digest.hexdigest()}), flush=True)
"""


def digests(threads: list[int], pin: int | None = None) -> dict[int, str]:
    command = [sys.executable, "-c", CHILD, ",".join(map(str, threads))]
    if pin is not None:
        command = ["taskset", "-c", str(pin)] + command
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
                              env={**os.environ, "OMP_NUM_THREADS": str(max(threads))})
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"decode steps at {threads} threads did not finish in {TIMEOUT_S} s; "
                             f"finished: {exc.stdout}") from None
    assert done.returncode == 0, done.stderr[-3000:]
    got = {(r := json.loads(line))["threads"]: r["digest"] for line in done.stdout.splitlines()}
    assert sorted(got) == sorted(threads), done.stdout
    return got


def test_every_thread_count_computes_the_same_bits():
    got = digests([1, 3, 8, 32])
    assert len(set(got.values())) == 1, got


def test_beside_a_busy_loop_on_each_cpu_the_team_finishes_with_the_same_bits():
    want = digests([1])[1]
    hogs = [subprocess.Popen(["timeout", str(HOG_S), "taskset", "-c", str(cpu), "sh", "-c", "while :; do :; done"],
                             start_new_session=True) for cpu in sorted(os.sched_getaffinity(0))]
    try:
        got = digests([2, 3, 8, 32])
    finally:
        for hog in hogs:
            if hog.poll() is None:
                os.killpg(hog.pid, signal.SIGKILL)
            hog.wait()
    assert set(got.values()) == {want}, got


def test_pinned_to_one_cpu_a_team_of_several_threads_computes_the_same_bits():
    want = digests([1])[1]
    got = digests([2, 8], pin=min(os.sched_getaffinity(0)))
    assert set(got.values()) == {want}, got
