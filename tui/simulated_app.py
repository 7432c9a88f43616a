"""The live dashboard over a what-if engine: the same panels and keys, simulated time paced against
wall time (< and > change the speed), and SIMULATED <device> wherever numbers are modelled."""

from __future__ import annotations

import math

from textual.binding import Binding

from batchtop.core_engine.run.pace import WallPace
from batchtop.core_engine.simulate.simulation import Simulation
from batchtop.tui.app import BatchtopApp
from batchtop.tui.sources.live import EngineBridge
from batchtop.tui.sources.frame import DashboardFrame


def speed_label(speed: float) -> str:
    return "max speed" if math.isinf(speed) else f"{speed:g}x"


class SimulatedApp(BatchtopApp):
    BINDINGS = [
        Binding("less_than_sign", "slower", "slower", key_display="<"),
        Binding("greater_than_sign", "faster", "faster", key_display=">"),
        *BatchtopApp.BINDINGS,
    ]

    def __init__(self, bridge: EngineBridge, simulation: Simulation, **kwargs) -> None:
        self.simulation = simulation
        super().__init__(bridge, device_label=f"{simulation.device.label} (simulated)", **kwargs)

    @property
    def pace(self) -> WallPace:
        assert self.bridge.pace is not None, "a simulated dashboard runs a paced bridge"
        return self.bridge.pace

    def status_extra(self, frame: DashboardFrame) -> str:
        sim = f"{self.simulation.tag} · {speed_label(self.pace.speed)}"
        if self.pace.behind and frame.state == "running":
            sim += " (host-bound: slower)"  # simulating a step takes longer than the pace allows
        rest = super().status_extra(frame)
        return f"{sim} │ {rest}" if rest else sim

    def action_slower(self) -> None:
        self.notify(f"simulated time at {speed_label(self.pace.slower())} wall time", timeout=1.5)

    def action_faster(self) -> None:
        self.notify(f"simulated time at {speed_label(self.pace.faster())} wall time", timeout=1.5)
