"""The dashboard over a recorded session: same panels, replay keys, REPLAY and position in the status line."""

from __future__ import annotations

from textual.binding import Binding

from batchtop.tui.app import COMMON_BINDINGS, Dashboard
from batchtop.tui.sources.frame import DashboardFrame
from batchtop.tui.sources.replay import ReplaySource


class ReplayApp(Dashboard):
    LIVE = False
    BINDINGS = [
        Binding("space", "toggle_pause", "pause"),
        Binding("less_than_sign", "slower", "slower", key_display="<"),
        Binding("greater_than_sign", "faster", "faster", key_display=">"),
        Binding("n", "step", "step"),
        Binding("g", "start", "start"),
        Binding("G", "end", "end", key_display="G"),
        *COMMON_BINDINGS,
    ]
    bridge: ReplaySource

    def status_extra(self, frame: DashboardFrame) -> str:
        parts = [self.bridge.position()]
        if self.bridge.recorded_pause:
            parts.append("paused in the recording")
        if frame.caption:
            parts.append(frame.caption)
        return " │ ".join(parts)

    def action_toggle_pause(self) -> None:
        self.bridge.toggle_pause()

    def action_slower(self) -> None:
        self.notify(f"replay at {self.bridge.slower():g}x", timeout=1.5)

    def action_faster(self) -> None:
        self.notify(f"replay at {self.bridge.faster():g}x", timeout=1.5)

    def action_step(self) -> None:
        if not self.bridge.paused:
            self.bridge.toggle_pause()
        self.bridge.step_once()

    def action_start(self) -> None:
        self.bridge.seek_start()

    def action_end(self) -> None:
        self.bridge.seek_end()
