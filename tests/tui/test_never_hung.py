"""A dashboard that never looks hung: while one step takes long (a first step on the torch ops can take a
minute) the status line's clock and counters still move, and a pressed key shows at once as pending.

The step is held by a model runner that blocks until the test lets it go; the status line's wall clock
(tui/sources/wall.py) is a fake the test moves, so nothing here waits on real seconds.
"""

from __future__ import annotations

import random
import threading

import pytest

from batchtop.core_engine.engine import control
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.worker.model_runner import ModelRunner
from batchtop.gpu_kernels import cpu_kernels
from batchtop.gpu_kernels.cpu_kernel_build import BuildState
from batchtop.tui.app import BatchtopApp
from batchtop.tui.sources import wall
from batchtop.tui.sources.live import EngineSource
from batchtop.tui.sources.pending import fold
from batchtop.tui.sources.preparing import PreparingSource
from batchtop.tui.sources.source import EngineInfo
from tests.conftest import tiny_config
from tests.tui.test_dashboard import PEAKS, WORKLOAD, TickClock, status, steps, wait_for

LAUNCH = 1000.0


class FakeWall:
    """The status line's wall clock, moved by hand; batchtop 'started' 42 s before the test's time 0."""

    def __init__(self) -> None:
        self.t = LAUNCH + 42.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch) -> FakeWall:
    fake = FakeWall()
    monkeypatch.setattr(wall, "now", fake)
    monkeypatch.setattr(wall, "LAUNCHED", LAUNCH)
    return fake


class HeldRunner(ModelRunner):
    """A real runner whose forward in each step of `hold_at` waits for that step's `release`; every other
    step runs at once."""

    def __init__(self, config, hold_at: tuple[int, ...] = (1,)) -> None:
        super().__init__(config)
        self.calls = 0
        self.entered = {n: threading.Event() for n in hold_at}  # that step's forward has begun
        self.release = {n: threading.Event() for n in hold_at}

    def run(self, batch):
        self.calls += 1
        if self.calls in self.release:
            self.entered[self.calls].set()
            assert self.release[self.calls].wait(30), "the test never released the step"
        return super().run(batch)

    def release_all(self) -> None:
        for event in self.release.values():
            event.set()


def held_app(hold_at: tuple[int, ...] = (1,), **overrides) -> tuple[BatchtopApp, HeldRunner]:
    config = tiny_config(**{"max_num_seqs": 4, **overrides})
    runner = HeldRunner(config, hold_at)
    source = EngineSource(Engine(config, runner=runner, clock=TickClock()), WORKLOAD, start_paused=True, peaks=PEAKS,
                          device_label="test-cpu")
    return BatchtopApp(source), runner


async def test_the_clock_and_the_step_counter_move_while_a_step_is_in_flight(clock):
    app, runner = held_app()
    async with app.run_test(size=(160, 36)) as pilot:
        try:
            await pilot.press("space")
            await wait_for(pilot, runner.entered[1].is_set)
            await wait_for(pilot, lambda: "● running 0:42" in status(app))
            first = status(app)
            clock.t += 5  # no frame comes while the step is held: only the status line's own tick repaints
            await wait_for(pilot, lambda: "● running 0:47" in status(app))
            assert "step 1: 5 s so far" in status(app) and status(app) != first
            clock.t += 60
            await wait_for(pilot, lambda: "● running 1:47" in status(app) and "step 1: 65 s so far" in status(app))
            assert steps(app) == 0 and not runner.release[1].is_set()  # all of it while the first step was in flight
        finally:
            runner.release_all()
        await wait_for(pilot, lambda: steps(app) >= 1)
        assert "so far" not in status(app)


async def test_keys_pressed_during_a_step_show_as_pending_until_the_engine_applies_them(clock):
    app, runner = held_app(hold_at=(2, 3))
    async with app.run_test(size=(160, 36)) as pilot:
        try:
            await pilot.press("space")
            await wait_for(pilot, lambda: runner.entered[2].is_set() and app.source.frame.state == "running")
            assert steps(app) == 1
            for key, shown in (("right_square_bracket", "max_num_seqs=4 → 8 (at next step)"),
                               ("plus", "max_num_seqs=4 → 9 (at next step)"),
                               ("minus", "max_num_seqs=4 → 8 (at next step)")):
                await pilot.press(key)
                await wait_for(pilot, lambda: shown in status(app))
            await pilot.press("s")
            await wait_for(pilot, lambda: "mode=continuous → static" in status(app))
            assert steps(app) == 1 and not runner.release[2].is_set()  # all of it before step 2 ended
            runner.release[2].set()  # step 3 takes the keys as it begins; its frame comes when it ends
            await wait_for(pilot, lambda: runner.entered[3].is_set() and steps(app) == 2)
            await wait_for(pilot, lambda: "max_num_seqs=4 → 8 (in the step in flight)" in status(app))
            assert "mode=continuous → static" in status(app)
            await pilot.press("space")
            await wait_for(pilot, lambda: "pausing after this step" in status(app))
            assert steps(app) == 2 and not runner.release[3].is_set()
        finally:
            runner.release_all()
        await wait_for(pilot, lambda: "‖ paused" in status(app))
        line = status(app)
        assert steps(app) == 3 and "mode=static" in line and "max_num_seqs=8 " in line
        assert "→" not in line and "at next step" not in line and "in flight" not in line  # nothing pending now
        assert app.source.engine.max_num_seqs == 8 and app.source.engine.mode == "static"


async def test_a_key_that_changes_nothing_shows_nothing_pending(clock):
    app, runner = held_app()
    async with app.run_test(size=(160, 36)) as pilot:
        try:
            await pilot.press("space")
            await wait_for(pilot, runner.entered[1].is_set)
            await pilot.press("s", "s", "right_square_bracket", "left_square_bracket")  # each undoes the other
            await pilot.pause()
            app.poll(force=True)
            assert "→" not in status(app) and "at next step" not in status(app)
        finally:
            runner.release_all()


async def test_a_first_step_on_the_torch_ops_says_so_and_counts_while_the_kernels_build(clock, monkeypatch):
    build = {"state": BuildState("building", done=3, total=7, started=clock.t - 20)}
    monkeypatch.setattr(cpu_kernels, "background_state", lambda: build["state"])
    monkeypatch.setattr(cpu_kernels, "active", lambda: False)
    config = tiny_config(max_num_seqs=4)
    runner = HeldRunner(config)

    def prepare(say):
        return EngineSource(Engine(config, runner=runner, clock=TickClock()), WORKLOAD, peaks=PEAKS)

    app = BatchtopApp(PreparingSource(EngineInfo(config, PEAKS, "test-cpu"), prepare, kernels=True))
    async with app.run_test(size=(180, 36)) as pilot:
        try:
            await wait_for(pilot, runner.entered[1].is_set)
            clock.t += 12
            await wait_for(pilot, lambda: "first step: 12 s, running torch ops while the C++ kernels build "
                                          "(3/7 done, 32 s)" in status(app))
            clock.t += 3
            await wait_for(pilot, lambda: "first step: 15 s" in status(app) and "(3/7 done, 35 s)" in status(app))
            assert "so far" not in status(app)  # one line says both
        finally:
            runner.release_all()
        await wait_for(pilot, lambda: steps(app) >= 1)
        await wait_for(pilot, lambda: "CPU kernels building (3/7 done, 35 s): torch ops meanwhile" in status(app))
        assert "first step" not in status(app)
        build["state"] = BuildState("built", done=7, total=7, started=clock.t - 35)  # not yet switched in
        await wait_for(pilot, lambda: "CPU kernels built: they come in after the step in flight" in status(app))


def test_the_pending_value_is_the_one_the_engine_then_applies():
    engine = Engine(tiny_config(max_num_seqs=4, max_num_batched_tokens=64))
    keys = [control.ToggleMode(), control.ChangeMaxNumSeqs(add=1), control.ChangeMaxNumSeqs(add=-1),
            control.ChangeMaxNumSeqs(multiply=2), control.ChangeMaxNumSeqs(multiply=0.5)]
    rng = random.Random(0)
    seen = set()
    for _ in range(200):
        presses = tuple(rng.choice(keys) for _ in range(rng.randint(1, 6)))
        expected = fold(engine.mode, engine.max_num_seqs, engine.max_num_seqs_cap, presses)
        for command in presses:
            engine.submit(command)
        engine.apply_pending()
        assert (engine.mode, engine.max_num_seqs) == expected
        seen.add(engine.max_num_seqs)
    assert {1, engine.max_num_seqs_cap} <= seen  # both clamps were exercised
