"""Live controls as a user presses them: quick presses compose, a restart keeps what the engine runs,
and max_num_seqs never outgrows the token budget."""

from __future__ import annotations

import pytest

from batchtop.core_engine.engine import control
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.errors import ConfigError
from batchtop.tui.app import BatchtopApp
from batchtop.tui.sources.live import EngineSource
from tests.conftest import FakeClock, make_requests, tiny_config
from tests.tui.test_dashboard import PEAKS, WORKLOAD, TickClock, status, wait_for


def dashboard(**overrides) -> BatchtopApp:
    config = tiny_config(**overrides)
    source = EngineSource(Engine(config, clock=TickClock()), WORKLOAD, start_paused=True, peaks=PEAKS,
                          device_label="test-cpu")
    return BatchtopApp(source)


def test_quick_presses_compose_instead_of_repeating_a_stale_frame():
    # keys pressed while the engine thread is busy in a step: no frame comes between them
    app = dashboard(max_num_seqs=16, max_num_batched_tokens=256)
    engine = app.source.engine
    for _ in range(50):
        app.source.act("more_seqs")
    engine.apply_pending()
    assert engine.max_num_seqs == 66
    app.source.act("halve_seqs")
    app.source.act("halve_seqs")
    engine.apply_pending()
    assert engine.max_num_seqs == 16
    for _ in range(3):
        app.source.act("double_seqs")
    engine.apply_pending()
    assert engine.max_num_seqs == 128
    app.source.act("toggle_mode")
    app.source.act("toggle_mode")
    engine.apply_pending()
    assert engine.mode == "continuous"
    app.source.act("toggle_mode")
    engine.apply_pending()
    assert engine.mode == "static"


async def test_the_status_line_follows_quick_presses():
    app = dashboard(max_num_seqs=16, max_num_batched_tokens=256)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press(*["plus"] * 10, "s")
        await wait_for(pilot, lambda: "max_num_seqs=26 " in status(app) and "mode=static" in status(app))


async def test_restart_while_paused_shows_the_mode_the_engine_runs():
    app = dashboard()
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("s")
        await wait_for(pilot, lambda: "mode=static" in status(app))
        await pilot.press("r")
        await wait_for(pilot, lambda: app.source.runs == 2)
        await pilot.pause()
        app.poll(force=True)
        assert app.source.engine.mode == "static" and "mode=static" in status(app)


async def test_max_num_seqs_stops_at_the_token_budget_and_says_why():
    app = dashboard(max_num_seqs=16, max_num_batched_tokens=32)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press(*["right_square_bracket"] * 3)
        await wait_for(pilot, lambda: "max_num_seqs=32 " in status(app))
        await pilot.press("plus")
        await pilot.pause()
        assert any("cap" in n.message and "max_num_batched_tokens" in n.message for n in app._notifications)
        app.poll(force=True)
        assert "max_num_seqs=32 " in status(app)


def test_the_engine_refuses_more_slots_than_the_budget_can_decode():
    engine = Engine(tiny_config(max_num_seqs=4, max_num_batched_tokens=8))
    with pytest.raises(ValueError, match="above max_num_batched_tokens 8"):
        engine.submit(control.SetMaxNumSeqs(9))
    with pytest.raises(ConfigError, match="max_num_seqs: 5 is above max_num_batched_tokens 4"):
        tiny_config(max_num_seqs=5, max_num_batched_tokens=4)


def test_a_reset_submitted_from_another_thread_is_applied_inside_the_step():
    clock = FakeClock()
    engine = Engine(tiny_config(), clock=clock)
    engine.load_workload(make_requests(3))
    for _ in range(3):
        clock.advance(0.5)
        engine.step()
    engine.submit(control.Reset())  # as the UI thread does; the engine thread's next step applies it
    clock.advance(0.5)
    snap = engine.step()
    assert snap.step == 1 and snap.t == 0.0 and snap.counters.steps == 1  # a fresh run, its clock restarted
    assert ("reset", None) in snap.controls and set(snap.admitted) == {"r0", "r1", "r2"}
