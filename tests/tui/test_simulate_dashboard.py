"""The dashboard over a what-if engine: SIMULATED on screen, speed keys, simulated time paced to wall time."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest

from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.simulate.calibration import DEFAULT
from batchtop.core_engine.simulate.clock import VirtualClock
from batchtop.core_engine.run.playback_speed import WallPace
from batchtop.core_engine.simulate.simulated_devices import simulated_device
from batchtop.core_engine.simulate.simulation import Simulation
from batchtop.tui.sources.live import EngineSource
from batchtop.tui.app import BatchtopApp
from batchtop.tui.widgets.engine.device import DevicePanel
from batchtop.tui.widgets.engine.kv_blocks import KVBlocksPanel
from batchtop.tui.widgets.engine.roofline import RooflinePanel
from batchtop.tui.widgets.engine.slots import SlotsPanel
from batchtop.tui.widgets.engine.waiting import WaitingPanel
from tests.conftest import tiny_config
from tests.tui.test_dashboard import WORKLOAD, status, step, wait_for

H200 = simulated_device("h200")


def make_app(requests: list[Request] = WORKLOAD, speed: float = 1.0, calibration=DEFAULT) -> BatchtopApp:
    config = tiny_config(max_num_seqs=4)
    simulation = Simulation(H200, H200.peaks(config.dtype), calibration)
    engine = simulation.engine(config)
    return BatchtopApp(EngineSource(engine, requests, start_paused=True, pace=WallPace(engine.clock, speed),
                                    simulation=simulation, peaks=simulation.peaks))


async def test_the_status_line_and_every_modelled_panel_say_simulated_and_the_speed_keys_work():
    app = make_app()
    async with app.run_test(size=(140, 36)) as pilot:
        await step(pilot, 2)
        assert "SIMULATED H200 · 1x" in status(app) and "H200 (simulated)" in status(app)
        for panel in (KVBlocksPanel, WaitingPanel, RooflinePanel, DevicePanel):
            assert "SIMULATED H200" in app.query_one(panel).border_title, panel
        assert "SIMULATED" not in app.query_one(SlotsPanel).border_title  # the scheduler's own decisions
        device = app.query_one(DevicePanel).render().plain
        assert "memory 141 GiB" in device and "eff compute 0.60 · memory 0.80" in device
        for key, label in (("greater_than_sign", "2x"), ("greater_than_sign", "4x"), ("less_than_sign", "2x"),
                           ("less_than_sign", "1x"), ("less_than_sign", "0.5x")):
            await pilot.press(key)
            await wait_for(pilot, lambda: f"SIMULATED H200 · {label}" in status(app))


async def test_the_device_panel_names_a_calibration_file_without_its_long_directory():
    source = "/home/someone/experiments/2026-12-01/gpu-box-07/calibrations/h200-bf16.calibration.json"
    app = make_app(calibration=dataclasses.replace(DEFAULT, source=source))
    async with app.run_test(size=(140, 36)) as pilot:
        await step(pilot, 1)
        device = app.query_one(DevicePanel).render().plain
        assert "ms/step (h200-bf16.calibration.json)" in device and "experiments" not in device


async def test_an_hour_without_arrivals_passes_at_once_at_max_speed():
    requests = [Request("a", (1, 2, 3), 3), Request("b", (4, 5, 6), 3, arrival_s=3600.0)]
    app = make_app(requests, speed=math.inf)
    async with app.run_test(size=(120, 36)) as pilot:
        started = time.monotonic()
        await pilot.press("space")
        await wait_for(pilot, lambda: app.source.frame.state == "finished")
        assert time.monotonic() - started < 10
        assert app.source.frame.snapshot.t > 3600 and app.source.frame.metrics.completed == 2
        assert "max speed" in status(app)


class FakeWall:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_pace_holds_simulated_time_to_a_multiple_of_wall_time():
    clock, wall = VirtualClock(), FakeWall()
    pace = WallPace(clock, speed=2.0, wall=wall)
    clock.advance(1.0)  # a modelled step of 1 s at 2x: wait half a second of wall time
    assert pace.ahead_s() == pytest.approx(0.5)
    wall.t += 0.5
    assert pace.ahead_s() == 0
    wall.t += 1.0  # wall time allows 2 more simulated seconds; the next arrival is 10 s away
    assert pace.idle(10.0) == pytest.approx(4.0) and clock() == pytest.approx(3.0)
    wall.t += 10.0  # idle while paused: held, not made up for afterwards
    pace.hold()
    assert pace.idle(8.0) == pytest.approx(4.0) and clock() == pytest.approx(3.0)


def test_a_host_too_slow_for_the_pace_runs_flat_out_and_says_so():
    clock, wall = VirtualClock(), FakeWall()
    pace = WallPace(clock, speed=1.0, wall=wall)
    wall.t += 2.0  # simulating took 2 s of wall time and produced no simulated time
    assert pace.ahead_s() == 0 and pace.behind
    clock.advance(0.1)  # then a 100 ms step: after giving up the backlog, the pace waits for it again
    assert pace.ahead_s() == pytest.approx(0.1) and not pace.behind
