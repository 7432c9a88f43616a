"""The dashboard under Pilot, with the engine paused and stepped by hand: keys, panels, errors."""

from __future__ import annotations

import asyncio
import io
import time

import pytest
from rich.console import Console

from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.worker.model_runner import ModelRunner
from batchtop.core_engine.run.script import ScriptAction, ScriptPlayer
from batchtop.core_engine.run.live_session import Session
from batchtop.core_engine.trace.trace import Recorder, read_trace
from tests.conftest import fail_on_call, tiny_config
from batchtop.tui.app import BatchtopApp
from batchtop.tui.sources.live import EngineSource
from batchtop.tui.screens.help import HelpScreen
from batchtop.tui.widgets.engine.kv_blocks import KVBlocksPanel
from batchtop.tui.widgets.engine.slots import SlotsPanel
from batchtop.tui.widgets.common.status_line import StatusLine
from batchtop.tui.widgets.engine.waiting import WaitingPanel

PEAKS = DevicePeaks("Test CPU", 4e11, 3.5e10, "measured:test")
WORKLOAD = [Request(f"q{i}", tuple(range(1, 3 + 2 * i)), [3, 9, 2, 6, 4, 8, 5, 7][i % 8]) for i in range(10)]


class TickClock:
    """Advances 1 ms per reading: step times and latencies are the same on every machine."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.001
        return self.t


def make_app(mode: str = "continuous", runner: ModelRunner | None = None, **overrides) -> BatchtopApp:
    config = tiny_config(**{"mode": mode, "max_num_seqs": 4, **overrides})
    engine = Engine(config, runner=runner, clock=TickClock())
    return BatchtopApp(EngineSource(engine, WORKLOAD, start_paused=True, peaks=PEAKS, device_label="test-cpu"))


async def wait_for(pilot, predicate, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if predicate():
            pilot.app.poll(force=True)
            await pilot.pause()
            return
        await asyncio.sleep(0.02)
    raise AssertionError("timed out waiting for the dashboard")


def steps(app: BatchtopApp) -> int:
    snap = app.source.frame.snapshot
    return snap.counters.steps if snap is not None else 0


async def step(pilot, n: int = 1) -> None:
    target = steps(pilot.app) + n
    for _ in range(n):
        await pilot.press("n")
    await wait_for(pilot, lambda: steps(pilot.app) == target)


def status(app: BatchtopApp) -> str:
    return str(app.query_one(StatusLine).render())


def panel_text(app: BatchtopApp, panel_type) -> str:
    return app.query_one(panel_type).render().plain


def screen_text(app: BatchtopApp) -> str:
    """The screen as plain text, rendered the way export_screenshot renders it."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor", record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


async def test_status_line_follows_mode_and_max_num_seqs_keys():
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: "mode=continuous" in status(app))
        assert "max_num_seqs=4" in status(app) and "paused" in status(app)
        await pilot.press("s")
        await wait_for(pilot, lambda: "mode=static" in status(app))
        for key, expected in (("plus", 5), ("equals_sign", 6), ("minus", 5), ("right_square_bracket", 10),
                              ("left_square_bracket", 5)):
            await pilot.press(key)
            await wait_for(pilot, lambda: f"max_num_seqs={expected}" in status(app))
        for _ in range(7):
            await pilot.press("minus")
        await wait_for(pilot, lambda: "max_num_seqs=1 " in status(app))  # never below 1
        await pilot.press("s")
        await wait_for(pilot, lambda: "mode=continuous" in status(app))


async def test_n_steps_once_while_paused_and_panels_show_the_occupants():
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await step(pilot)
        slots = panel_text(app, SlotsPanel)
        # step 1 admits the first four requests (4 slots) and prefills them; the rest wait in order
        assert all(f"q{i}" in slots for i in range(4)) and "q4" not in slots
        waiting = panel_text(app, WaitingPanel)
        assert waiting.index("q4") < waiting.index("q5") < waiting.index("q9")
        assert "slots full" in waiting
        snap = app.source.frame.snapshot
        c = snap.counters  # the prompts are prefixes of each other: q2 and q3 find q1's first block
        assert c.prefix_hits == 4 + 4 and c.prefix_queries == 2 + 4 + 6 + 8
        assert app.query_one(KVBlocksPanel).border_title == f"KV blocks {snap.num_used_blocks}/64 used " \
                                                            f"({100 * snap.num_used_blocks / 64:.0f}%) · hit 40%"
        await step(pilot, 2)
        # q2 asked for 2 tokens: it finished at step 2 and q4 took its slot at step 3
        assert "q4" in panel_text(app, SlotsPanel) and "q2" not in panel_text(app, SlotsPanel)
        assert steps(app) == 3


async def test_space_runs_and_pauses_and_the_finished_workload_stays_on_screen():
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("space")
        await wait_for(pilot, lambda: app.source.frame.state == "finished")
        assert "finished" in status(app)
        assert app.source.frame.metrics.completed == len(WORKLOAD)
        assert "done 10/10" in screen_text(app)
        await pilot.press("r")  # r runs it again from the start
        await wait_for(pilot, lambda: app.source.runs == 2 and app.source.frame.state == "finished")
        assert app.source.frame.metrics.completed == len(WORKLOAD)
        await pilot.press("space")
        await wait_for(pilot, lambda: "paused" in status(app))


async def test_burst_adds_requests_and_restart_starts_over():
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await step(pilot, 2)
        await pilot.press("b")
        await step(pilot)
        snap = app.source.frame.snapshot
        assert app.source.frame.metrics.total == len(WORKLOAD) + 8
        assert snap.num_waiting + sum(1 for s in snap.slots if s.request_id) >= 8
        await pilot.press("r")
        await step(pilot)
        assert steps(app) == 1 and app.source.frame.metrics.total == len(WORKLOAD)


async def test_v_switches_the_slots_panel_to_a_timeline_and_t_cycles_themes():
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await step(pilot, 4)
        await pilot.press("v")
        await pilot.pause()
        panel = app.query_one(SlotsPanel)
        assert "timeline" in panel.border_title
        rows = panel.render().plain.splitlines()
        assert len(rows) == 5 and "decode" in rows[-1]  # four slot rows and the legend
        assert len(rows[0]) >= 4 + 4  # one column per step so far
        themes = [app.theme]
        for _ in range(3):
            await pilot.press("t")
            themes.append(app.theme)
        assert themes == ["batchtop-dark", "batchtop-light", "batchtop-colourblind", "batchtop-dark"]


async def test_help_opens_and_closes_and_q_quits_promptly():
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("space")  # engine running
        await pilot.press("q")
        await pilot.pause()
    assert app.return_value == 0


async def test_a_scripts_quit_action_closes_the_dashboard_and_its_recording(tmp_path):
    config = tiny_config(max_num_seqs=4)
    engine = Engine(config, clock=TickClock())
    path = str(tmp_path / "demo.jsonl")
    session = Session(engine, WORKLOAD, recorder=Recorder(path, {"config": {}}),
                      script=ScriptPlayer([ScriptAction(0.05, quit=True)]))
    app = BatchtopApp(EngineSource(engine, WORKLOAD, start_paused=True, session=session, peaks=PEAKS))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("space")
        await wait_for(pilot, lambda: app.return_value is not None)  # a hang fails here, not in CI's timeout
    assert app.return_value == 0 and app.source.done.is_set()
    assert read_trace(path).events[-1]["reason"] == "script quit"


async def test_a_caption_too_long_for_the_status_line_wraps_instead_of_being_cut():
    caption = "4/7 decode is memory-bound: every step reads all the weights once, whatever the batch size is"
    config = tiny_config(max_num_seqs=4)
    engine = Engine(config, clock=TickClock())
    session = Session(engine, WORKLOAD, script=ScriptPlayer([ScriptAction(0.0, caption=caption)]))
    app = BatchtopApp(EngineSource(engine, WORKLOAD, start_paused=True, session=session, peaks=PEAKS))
    async with app.run_test(size=(76, 30)) as pilot:
        await step(pilot, 1)
        line = app.query_one(StatusLine)
        assert line.size.height == 1 and "Test CPU" not in screen_text(app).splitlines()[0]  # cut, not wrapped
        await pilot.press("space")  # the script plays only while the engine runs
        await wait_for(pilot, lambda: app.source.frame.caption == caption)
        await pilot.press("space")
        await wait_for(pilot, lambda: app.source.frame.state == "paused")
        await pilot.pause()
        assert line.size.height == 2 and caption.split()[-1] in screen_text(app)


async def test_an_engine_crash_keeps_the_dashboard_up_and_says_why():
    runner = ModelRunner(tiny_config())
    runner.run = fail_on_call(runner.run, 3, "simulated CUDA error: device-side assert")
    app = make_app(runner=runner)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("space")
        await wait_for(pilot, lambda: app.source.frame.state == "error")
        assert "engine stopped" in status(app) and "simulated CUDA error" in status(app)
        assert steps(app) == 2  # the steps before the crash stay on screen
        await pilot.press("q")
    assert app.return_value == 1


@pytest.mark.parametrize("size", [(80, 24), (100, 30)])
async def test_small_terminals_still_show_every_panel(size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await step(pilot, 3)
        text = screen_text(app)
        for title in ("Slots", "KV blocks", "Waiting", "Roofline", "Device", "mode=continuous", "max_num_seqs=4"):
            assert title in text, title


async def test_every_panel_always_shows_the_same_step_as_the_others():
    config = tiny_config(max_num_seqs=4, max_num_batched_tokens=8)
    long_workload = [Request(f"L{i}", tuple(range(1, 20)), 150 + 10 * i) for i in range(8)]
    engine = Engine(config)
    run = engine.runner.run
    engine.runner.run = lambda batch: (time.sleep(0.01), run(batch))[1]  # paced: Pilot waits for an idle CPU
    app = BatchtopApp(EngineSource(engine, long_workload, start_paused=True, peaks=PEAKS))
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("space")
        await wait_for(pilot, lambda: app.source.frame.state == "running")  # on a busy host it takes a moment
        checked = 0
        while app.source.frame.state == "running" and checked < 30:
            await pilot.pause(0.05)
            shown = app._shown
            for panel in app.view._panels:  # what each panel draws is what the shown frame says it draws
                assert panel._key == panel.content_key(shown), type(panel).__name__
            checked += 1
        assert checked >= 10


def compact_timeline_rows(text: str) -> list[str]:
    """The compact timeline's labelled rows under the grid ("  0-1 ▀▀▀", "  32 ▀▀")."""
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("─ last "))
    return [line for line in lines[start + 1:] if line.strip()[:1].isdigit()]


@pytest.mark.parametrize("slots", [34, 300])
@pytest.mark.parametrize("size", [(160, 48), (100, 60)])
async def test_the_compact_timeline_shows_every_slot_or_says_which_it_does_not(slots, size):
    app = make_app(max_num_seqs=slots, max_num_batched_tokens=512, num_kv_blocks=2048)
    app.source.session.burst(slots)  # every slot taken
    async with app.run_test(size=size) as pilot:
        await step(pilot, 3)
        panel = app.query_one(SlotsPanel)
        text = panel_text(app, SlotsPanel)
        columns, grid_rows, _ = panel._layout
        if grid_rows > panel.content_size.height:  # the grid itself is cut: it says so, and which key helps
            assert f"of {slots} shown: v shows every slot" in text
        else:
            assert columns * grid_rows >= slots  # the grid shows every slot
        if "─ last " in text:  # room for the compact timeline under the grid
            labels = [row.split()[0] for row in compact_timeline_rows(text)]
            shown = sum(len(label.split("-")) for label in labels)
            if shown < slots:
                assert f"slots 0-{shown - 1} of {slots} shown · v: every slot" in text or \
                       f"{shown} of {slots} slots · v: all" in text
            else:
                assert shown == slots
        if size == (160, 48):  # the report's case: a few rows of 34 slots, the rest cut without a word
            assert "─ last " in text and f"of {slots} shown · v: every slot" in text
        await pilot.press("v")  # the full timeline: as many rows as fit, and a way to the rest
        await wait_for(pilot, lambda: panel.timeline)
        full = panel_text(app, SlotsPanel)
        if f"of {slots} · ↑↓ scroll" in full:
            await pilot.press("down")
            await wait_for(pilot, lambda: panel.timeline_top == 1)
            assert "slots 1-" in panel_text(app, SlotsPanel)


async def test_p_while_the_help_screen_is_open_saves_that_screen_and_says_where(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the screenshot lands in the working directory
    app = make_app()
    notes = []
    async with app.run_test(size=(100, 30)) as pilot:
        monkeypatch.setattr(app, "notify", lambda text, **kw: notes.append(text))
        await pilot.press("question_mark")
        await pilot.pause()
        await pilot.press("p")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)  # still open
    (svg,) = tmp_path.glob("batchtop_*.svg")
    assert any("screenshot saved to" in n and svg.name in n for n in notes)
    assert "Slots&#160;timeline" in svg.read_text()  # the help screen is what was saved
