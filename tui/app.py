"""The batchtop dashboard: panels over a frame source (the live engine bridge, or a replay).

The engine runs in a Textual thread worker (exit_on_error=False); the UI polls the newest frame on a
timer and never blocks it. Keys become commands on the source; nothing here touches engine state.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time

from rich.text import Text

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Footer
from textual.worker import Worker, WorkerState, get_current_worker

from batchtop.core_engine.config import EngineConfig
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.engine.snapshot import SlotView
from batchtop.core_engine.perf.telemetry import TelemetrySampler
from batchtop.core_engine.run.stop import exit_status
from batchtop.core_engine.simulate.simulation import Simulation
from batchtop.themes import STYLESHEET, THEMES, next_theme
from batchtop.tui.sources.live import EngineBridge
from batchtop.tui.sources.frame import DashboardFrame
from batchtop.tui.screenshot import save_screenshot
from batchtop.tui.widgets.engine.device import DevicePanel
from batchtop.tui.screens.help import HelpScreen
from batchtop.tui.screens.request_detail import RequestScreen
from batchtop.tui.widgets.engine.kv_blocks import KVBlocksPanel
from batchtop.tui.widgets.engine.metrics_strip import MetricsStrip
from batchtop.tui.widgets.engine.roofline import RooflinePanel
from batchtop.tui.widgets.engine.slots import SlotsPanel
from batchtop.tui.widgets.common.status_line import StatusLine, status_text
from batchtop.tui.widgets.engine.waiting import WaitingPanel

POLL_HZ = 10
PAINT_INTERVAL_S = 0.5  # while the engine runs: how often a new frame reaches the screen
QUIT_WAIT_S = 10.0  # longest we wait for a step in flight when quitting


COMMON_BINDINGS = [
    Binding("up", "move_slot(-1, 0)", "slot", show=False),
    Binding("down", "move_slot(1, 0)", "slot", show=False),
    Binding("left", "move_slot(0, -1)", "slot", show=False),
    Binding("right", "move_slot(0, 1)", "slot", show=False),
    Binding("enter", "open_slot", "request", show=False),
    Binding("v", "toggle_view", "timeline"),
    Binding("t", "next_theme", "theme", show=False),
    Binding("question_mark", "help", "help", key_display="?"),
    Binding("p", "save_svg", "screenshot", show=False),
    Binding("q", "quit", "quit"),
]


class EngineEvent(Message):
    """A rare event from the engine thread: it crashed, the workload finished, or a script quit."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__()
        self.kind = kind
        self.text = text


class Dashboard(App[int]):
    """Panels, themes, help and quit; subclasses add the keys of their frame source."""

    CSS_PATH = STYLESHEET
    TITLE = "batchtop"
    ENABLE_COMMAND_PALETTE = False
    LIVE = True  # False: a replay, with no engine or telemetry behind it
    simulation: Simulation | None = None  # a what-if run: its modelled panels say so

    def __init__(self, bridge, config: EngineConfig, peaks: DevicePeaks | None, *,
                 device_label: str | None = None, telemetry: TelemetrySampler | None = None,
                 theme: str = "batchtop-dark", poll_hz: float = POLL_HZ, arrivals: str = "") -> None:
        super().__init__()
        self.arrivals = arrivals  # how the workload's arrivals are paced (Waiting panel subtitle)
        self.bridge = bridge  # the frame source: EngineBridge (live) or ReplaySource
        self.config = config
        self.peaks = peaks
        self.device_label = device_label or (peaks.device_name if peaks is not None else config.device)
        self.telemetry = telemetry
        self.poll_hz = poll_hz
        for t in THEMES:
            self.register_theme(t)
        self.theme = theme
        self._shown: DashboardFrame | None = None
        self._panels: list = []
        self._status_text: Text | None = None
        self._last_paint = float("-inf")
        self.exit_code = 0
        self._sigterm_before = None  # the SIGTERM handler the app replaced while it runs
        bridge.notify = lambda kind, text: self.post_message(EngineEvent(kind, text))

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        with Horizontal(id="top"):
            yield SlotsPanel()
            yield KVBlocksPanel()
        with Horizontal(id="bottom"):
            yield WaitingPanel(self.arrivals)
            yield RooflinePanel(self.peaks, calibration=self.simulation.calibration if self.simulation else None)
            yield DevicePanel(self.config, self.peaks, live=self.LIVE, simulation=self.simulation)
        yield MetricsStrip(id="metrics")
        yield Footer()

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(THEMES[0].variables)  # panels' own variables resolve under any theme

    def on_mount(self) -> None:
        self._panels = [self.query_one(p) for p in (SlotsPanel, KVBlocksPanel, WaitingPanel, RooflinePanel,
                                                     DevicePanel)]
        for panel in self._panels:
            if self.simulation is not None and panel.MODELLED:
                panel.modelled_tag = self.simulation.tag
        self._device, self._metrics, self._status = (self.query_one(DevicePanel), self.query_one(MetricsStrip),
                                                     self.query_one(StatusLine))
        self.set_interval(1 / self.poll_hz, self.poll)
        if self.telemetry is not None:
            self.telemetry.start()
        self.poll()
        self.call_after_refresh(self.run_engine)  # the first paint is the costliest: let it finish first
        self._quit_on_sigterm(True)

    def _quit_on_sigterm(self, on: bool) -> None:
        """While the app runs, SIGTERM quits as `q` does (the engine finishes its step and closes a
        recording); afterwards the handler it replaced (the CLI's) is back. Unix main thread only."""
        if sys.platform == "win32" or threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        if on:
            self._sigterm_before = signal.getsignal(signal.SIGTERM)
            loop.add_signal_handler(signal.SIGTERM, self._terminate)
        elif self._sigterm_before is not None:
            loop.remove_signal_handler(signal.SIGTERM)  # which leaves the default (kill) behind
            signal.signal(signal.SIGTERM, self._sigterm_before)
            self._sigterm_before = None

    def _terminate(self) -> None:
        if self.exit_code == 0:
            self.exit_code = exit_status(signal.SIGTERM)
        self.call_next(self.action_quit)

    def on_unmount(self) -> None:
        self._panels = []  # a late timer tick or engine message must not draw into a torn-down screen
        self._quit_on_sigterm(False)

    @work(thread=True, exit_on_error=False, name="engine", group="engine")
    def run_engine(self) -> None:
        worker = get_current_worker()
        self.bridge.run(lambda: worker.is_cancelled)

    # -- drawing --------------------------------------------------------------------------------
    def poll(self, force: bool = False) -> None:
        """Show the newest frame: every panel gets the same one (so all show the same step) and
        repaints only if its picture changed.

        On 2 cores every millisecond the UI draws is taken from the engine, so while it runs a new
        frame is shown at most every PAINT_INTERVAL_S; paused, finished or stepped by hand, at once."""
        if not self._panels:  # not mounted yet (or already torn down)
            return
        frame = self.bridge.frame
        force = force or frame.state != (self._shown.state if self._shown is not None else None)
        now = time.monotonic()
        if not force and (frame is self._shown or (frame.state in ("running", "replay")
                                                     and now - self._last_paint < PAINT_INTERVAL_S)):
            return
        self._shown, self._last_paint = frame, now
        if self.telemetry is not None:
            self._device.sample = self.telemetry.latest
        for panel in self._panels:
            panel.show(frame, force)
        self._metrics.show(frame)
        text, essential = status_text(frame, self.config, self.device_label, self.status_extra(frame))
        if force or text != self._status_text:
            self._status_text = text
            self._status.show(text, essential, frame.state)

    def status_extra(self, frame: DashboardFrame) -> str:
        if frame.error:
            return frame.error
        return frame.caption or ""

    async def on_engine_event(self, event: EngineEvent) -> None:
        if event.kind == "quit":  # a script's last action: the engine thread has already closed its trace
            await self.action_quit()
            return
        if event.kind == "error":
            self.exit_code = 1
            self.notify(event.text, title="engine stopped", severity="error", timeout=30)
        else:
            self.notify(event.text, title=event.kind)
        self.poll()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.name == "engine" and event.state is WorkerState.ERROR:
            self.exit_code = 1
            self.notify(str(event.worker.error), title="engine stopped", severity="error", timeout=30)

    def action_toggle_view(self) -> None:
        self.query_one(SlotsPanel).toggle_view()

    def action_move_slot(self, rows: int, columns: int) -> None:
        self.query_one(SlotsPanel).move_selection(rows, columns)

    def action_open_slot(self) -> None:
        self.open_request(self.query_one(SlotsPanel).selected_slot())

    def on_slots_panel_chosen(self, message: SlotsPanel.Chosen) -> None:
        self.open_request(message.slot)

    def open_request(self, slot: SlotView | None) -> None:
        """The detail view of the request in that slot: its prompt and output, live."""
        if slot is None:
            self.notify("pick a slot with the arrow keys first", timeout=2)
        elif slot.request_id is None:
            self.notify(f"slot {slot.slot} is empty", timeout=2)
        else:
            self.push_screen(RequestScreen(slot.index, slot.request_id))

    def action_next_theme(self) -> None:
        self.theme = next_theme(self.theme)
        for panel in self.query(".panel"):
            panel.refresh()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_save_svg(self) -> None:
        save_screenshot(self, "batchtop")

    async def action_quit(self) -> None:
        """Let the engine thread finish its step (and close a recording) before the app goes."""
        self.bridge.stop()
        for _ in range(int(QUIT_WAIT_S / 0.02)):
            if self.bridge.done.is_set():
                break
            await asyncio.sleep(0.02)
        self.workers.cancel_group(self, "engine")
        if self.telemetry is not None:
            self.telemetry.stop()
        self.exit(self.exit_code)


class BatchtopApp(Dashboard):
    """The live dashboard: keys steer the running engine through its bridge."""

    BINDINGS = [
        Binding("s", "toggle_mode", "static/continuous"),
        Binding("plus,equals_sign", "more_seqs", "+seq", key_display="+"),
        Binding("minus", "fewer_seqs", "-seq", key_display="-"),
        Binding("right_square_bracket", "double_seqs", "×2", show=False, key_display="]"),
        Binding("left_square_bracket", "halve_seqs", "÷2", show=False, key_display="["),
        Binding("space", "toggle_pause", "pause"),
        Binding("n", "step", "step", show=False),
        Binding("b", "burst", "burst"),
        Binding("r", "restart", "restart", show=False),
        *COMMON_BINDINGS,
    ]
    bridge: EngineBridge

    def action_toggle_mode(self) -> None:
        self.bridge.toggle_mode()
        self.notify("static ⇄ continuous from the next admission (the status line shows the mode)", timeout=2)

    def _change_seqs(self, add: int = 0, multiply: float = 1.0) -> None:
        cap = self.bridge.max_num_seqs_cap
        if (add > 0 or multiply > 1) and self.bridge.current_max_num_seqs() >= cap:
            self.notify(f"max_num_seqs is at its cap, {cap}: max_num_batched_tokens must hold every decode "
                        "(start with a larger --max-num-batched-tokens)", timeout=3)
        self.bridge.change_max_num_seqs(add, multiply)

    def action_more_seqs(self) -> None:
        self._change_seqs(add=1)

    def action_fewer_seqs(self) -> None:
        self._change_seqs(add=-1)

    def action_double_seqs(self) -> None:
        self._change_seqs(multiply=2)

    def action_halve_seqs(self) -> None:
        self._change_seqs(multiply=0.5)

    def action_toggle_pause(self) -> None:
        self.bridge.toggle_pause()

    def action_step(self) -> None:
        if self.bridge.paused:
            self.bridge.step_once()
        else:
            self.notify("n steps while paused: press space first", timeout=2)

    def action_burst(self) -> None:
        n = self.bridge.burst()
        self.notify(f"burst: {n} requests arrive now", timeout=2)

    def action_restart(self) -> None:
        self.bridge.restart()
        self.notify("restarting the workload from t=0", timeout=2)
