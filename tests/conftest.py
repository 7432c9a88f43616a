"""Shared helpers: the tiny preset, hand-made workloads and a run-to-completion loop."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import random
import shutil
import tempfile

import pytest
import torch

from tests.support.triton_interpreter import import_for_the_interpreter

import_for_the_interpreter()  # before anything imports Triton: see the module's docstring

from batchtop.core_engine.config import EngineConfig, preset
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.perf.metrics import MetricsCollector
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.engine.snapshot import StepSnapshot
from tests.support.hf_checkpoints import hf_checkpoints  # noqa: F401  (a session fixture: tiny HF checkpoints)

# Device peaks are measured once and cached: keep the tests' cache out of the user's home. So is the
# CPU kernels' build (torch's extensions directory): the suite builds its own copy, once per session,
# and removes the directories it made when it ends.
SESSION_DIRS: list[str] = []
for variable, prefix in (("BATCHTOP_CACHE_DIR", "batchtop-test-cache-"),
                         ("TORCH_EXTENSIONS_DIR", "batchtop-test-kernels-")):
    if variable not in os.environ:
        os.environ[variable] = tempfile.mkdtemp(prefix=prefix)
        SESSION_DIRS.append(os.environ[variable])
torch.set_num_threads(1)  # tiny tensors: threads only add overhead; keeps the suite steady on 2 cores


def pytest_report_header(config) -> str:
    """The versions that decide which kernel tests run or skip, at the top of every run's output."""
    return "batchtop's kernels under: " + ", ".join(
        f"{name} {importlib.metadata.version(name) if importlib.util.find_spec(name) else 'absent'}"
        for name in ("torch", "triton", "numpy"))


def pytest_sessionfinish(session, exitstatus) -> None:
    for directory in SESSION_DIRS:
        shutil.rmtree(directory, ignore_errors=True)


class FakeClock:
    """A clock tests move by hand, so arrival-driven behaviour is deterministic."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def tiny_config(**overrides) -> EngineConfig:
    base = dict(model=preset("tiny"), dtype="float32", max_num_seqs=4, max_num_batched_tokens=64,
                block_size=4, num_kv_blocks=64, seed=0)
    base.update(overrides)
    return EngineConfig(**base)


def fail_on_call(run, n: int, message: str):
    """`run` (a ModelRunner.run, bound or not) that raises RuntimeError(message) on its n-th call:
    a device fault in the middle of a workload."""
    calls = 0

    def wrapped(*args):
        nonlocal calls
        calls += 1
        if calls == n:
            raise RuntimeError(message)
        return run(*args)

    return wrapped


def make_requests(n: int, seed: int = 0, prompt: tuple[int, int] = (1, 24), output: tuple[int, int] = (1, 16),
                  prefix: str = "r", vocab: int = 512) -> list[Request]:
    rng = random.Random(seed)
    return [Request(f"{prefix}{i}", tuple(rng.randrange(vocab) for _ in range(rng.randint(*prompt))),
                    rng.randint(*output)) for i in range(n)]


def run_all(engine: Engine, requests: list[Request] | None = None, check=None, on_idle=None,
            max_steps: int = 10_000) -> tuple[dict[str, tuple[int, ...]], list[StepSnapshot], MetricsCollector]:
    """Step to completion; returns output tokens by request id, every snapshot, and the metrics."""
    if requests:
        engine.load_workload(requests)
    outputs: dict[str, tuple[int, ...]] = {}
    snaps: list[StepSnapshot] = []
    collector = MetricsCollector()
    for _ in range(max_steps):
        if engine.is_done():
            break
        snap = engine.step()
        if check is not None:
            check(engine, snap)
        if not snap.is_step:
            if on_idle is not None:
                on_idle(engine)
            continue
        snaps.append(snap)
        collector.observe(snap)
        for f in snap.finished:
            outputs[f.request_id] = f.output_token_ids
    else:
        raise AssertionError("workload did not finish")
    return outputs, snaps, collector


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def wait_for_finishes(trace_path, count: int = 1, timeout: float = 120.0) -> None:
    """Block until a run recording to `trace_path` (plain JSON Lines) has finished `count` requests:
    a signal test then interrupts a run with work done, however busy the machine is."""
    import time
    from pathlib import Path

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = Path(trace_path)
        if path.exists() and path.read_text(encoding="utf-8", errors="replace").count('"type":"finish"') >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"no {count} finished requests in {trace_path} after {timeout} s")
