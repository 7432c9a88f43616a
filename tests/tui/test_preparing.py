"""The dashboard is up before its engine: the panels and a status line saying what is being prepared
(the model loading, the CPU kernels building in the background), then the live engine (tui/sources/preparing.py)."""

from __future__ import annotations

import threading

from batchtop.core_engine.engine.engine import Engine
from batchtop.gpu_kernels import cpu_kernels
from batchtop.gpu_kernels.cpu_kernel_build import BuildState
from batchtop.tui.app import BatchtopApp
from batchtop.tui.sources.live import EngineSource
from batchtop.tui.sources.preparing import PrepareFailed, PreparingSource
from batchtop.tui.sources.source import EngineInfo
from batchtop.tui.widgets.common.status_line import StatusLine
from tests.conftest import tiny_config
from tests.tui.test_dashboard import PEAKS, WORKLOAD, TickClock, wait_for


def status(app: BatchtopApp) -> str:
    return app.query_one(StatusLine).render().plain


def preparing_app(release: threading.Event, *, kernels: bool = False, fail: PrepareFailed | None = None):
    config = tiny_config()

    def prepare(say):
        say("loading tiny (0.14M params, float32)")
        release.wait(30)
        if fail is not None:
            raise fail
        return EngineSource(Engine(config, clock=TickClock()), WORKLOAD, start_paused=True, peaks=PEAKS)

    source = PreparingSource(EngineInfo(config, PEAKS, "test-cpu"), prepare, kernels=kernels)
    return BatchtopApp(source), source


async def test_the_panels_are_up_and_say_what_loads_before_the_engine_exists_then_the_engine_runs():
    release = threading.Event()
    app, source = preparing_app(release)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: "loading tiny" in status(app))
        assert "◌ loading" in status(app)
        await pilot.press("n")  # a key that needs the engine says why it does nothing yet
        assert source.inner is None
        release.set()
        await wait_for(pilot, lambda: source.inner is not None and source.inner.started.is_set())
        await pilot.press("n")
        await wait_for(pilot, lambda: app.source.frame.snapshot is not None)
        assert "loading tiny" not in status(app) and "step 1" in status(app)


async def test_a_model_that_cannot_be_loaded_is_shown_and_kept_for_the_exit_code():
    release = threading.Event()
    release.set()
    app, source = preparing_app(release, fail=PrepareFailed(2, "--model: broken.gguf: truncated tensor data"))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: source.failure is not None)
        await wait_for(pilot, lambda: "truncated tensor data" in status(app))
    assert source.failure == (2, "--model: broken.gguf: truncated tensor data")


async def test_the_status_line_follows_the_background_kernel_build_and_says_when_they_come_in(monkeypatch):
    state = {"now": BuildState("building", done=2, total=5, started=0.0)}
    monkeypatch.setattr(cpu_kernels, "background_state", lambda: state["now"])
    monkeypatch.setattr(cpu_kernels, "active", lambda: state["now"] is None)
    release = threading.Event()
    release.set()
    app, source = preparing_app(release, kernels=True)
    async with app.run_test(size=(160, 36)) as pilot:
        await wait_for(pilot, lambda: source.inner is not None and source.inner.started.is_set())
        await wait_for(pilot, lambda: "CPU kernels building (2/5 done" in status(app))
        assert "torch ops meanwhile" in status(app)
        state["now"] = None  # switched in between two steps
        await pilot.press("n")
        await wait_for(pilot, lambda: "CPU kernels in" in status(app))
