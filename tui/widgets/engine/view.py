"""The engine panel set: slots and KV blocks on top, waiting, roofline and device below, the metrics
strip under them. One frame goes to every panel at once, so all of them show the same step."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical

from batchtop.core_engine.run.frame import DashboardFrame
from batchtop.tui.sources.source import EngineInfo
from batchtop.tui.widgets.common.status_line import status_text
from batchtop.tui.widgets.engine.device import DevicePanel
from batchtop.tui.widgets.engine.kv_blocks import KVBlocksPanel
from batchtop.tui.widgets.engine.metrics_strip import MetricsStrip
from batchtop.tui.widgets.engine.roofline import RooflinePanel
from batchtop.tui.widgets.engine.slots import SlotsPanel
from batchtop.tui.widgets.engine.waiting import WaitingPanel, arrivals_label


class EngineView(Vertical):
    def __init__(self, info: EngineInfo) -> None:
        super().__init__(id="engine-view")
        self.info = info
        self._panels: list = []

    def compose(self) -> ComposeResult:
        info, sim = self.info, self.info.simulation
        with Horizontal(id="top"):
            yield SlotsPanel()
            yield KVBlocksPanel()
        with Horizontal(id="bottom"):
            yield WaitingPanel(arrivals_label(info.workload))
            yield RooflinePanel(info.peaks, calibration=sim.calibration if sim else None,
                                num_layers=info.config.model.num_hidden_layers)
            yield DevicePanel(info.config, info.peaks, live=info.live, simulation=sim, no_telemetry=info.no_telemetry)
        yield MetricsStrip(id="metrics")

    def on_mount(self) -> None:
        self._panels = [self.query_one(p) for p in (SlotsPanel, KVBlocksPanel, WaitingPanel, RooflinePanel,
                                                     DevicePanel)]
        for panel in self._panels:
            if self.info.simulation is not None and panel.MODELLED:
                panel.modelled_tag = self.info.simulation.tag
        self._device, self._metrics = self.query_one(DevicePanel), self.query_one(MetricsStrip)
        if self.info.telemetry is not None:
            self.info.telemetry.start()

    def on_unmount(self) -> None:
        self._panels = []  # a late timer tick must not draw into a torn-down screen
        if self.info.telemetry is not None:
            self.info.telemetry.stop()

    @property
    def ready(self) -> bool:
        return bool(self._panels)

    def show(self, frame: DashboardFrame, force: bool = False) -> None:
        if not self._panels:
            return
        if self.info.telemetry is not None:
            self._device.sample = self.info.telemetry.latest
        for panel in self._panels:
            panel.show(frame, force)
        self._metrics.show(frame)

    def status_line(self, frame: DashboardFrame, extra: str) -> tuple[Text, int]:
        return status_text(frame, self.info.config, self.info.device_label, extra)

    def repaint_after_theme_change(self) -> None:
        for panel in self._panels:
            panel.refresh()
