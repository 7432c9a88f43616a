"""The batchtop App: one Textual application over a frame source (a live, simulated or served engine, a
replay, a live attach or an attach replay).

The source runs in a thread worker (exit_on_error=False); the app polls its newest frame on a timer
and never blocks it. Keys become `source.act(...)` for the controls the source accepts; the footer
shows only those. Nothing here touches engine state.
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
from textual.message import Message
from textual.widgets import Footer
from textual.worker import Worker, WorkerState, get_current_worker

from batchtop.core_engine.run.stop import exit_status
from batchtop.core_engine.engine.snapshot import SlotView
from batchtop.themes import STYLESHEET
from batchtop.themes.palettes import THEMES, next_theme
from batchtop.tui.screens.help import HelpScreen
from batchtop.tui.screens.request_detail import RequestScreen
from batchtop.tui.screenshot import save_screenshot
from batchtop.tui.sources.source import ENGINE_LAYOUT, FrameSource
from batchtop.tui.widgets.common.status_line import StatusLine
from batchtop.tui.widgets.engine.slots import SlotsPanel

POLL_HZ = 10
PAINT_INTERVAL_S = 0.5  # while the engine runs: how often a new frame reaches the screen
STATUS_TICK_S = 0.2  # how often the status line's clocks are read again, new frame or not (a step may take a minute)
QUIT_WAIT_S = 10.0  # longest we wait for a step in flight when quitting


def _source_key(key: str, control: str, description: str, **kwargs) -> Binding:
    return Binding(key, f"source('{control}')", description, **kwargs)


class SourceEvent(Message):
    """A rare event from the source's thread: the engine crashed, the work finished, a script quit."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__()
        self.kind = kind
        self.text = text


class BatchtopApp(App[int]):
    CSS_PATH = STYLESHEET
    TITLE = "batchtop"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        _source_key("s", "toggle_mode", "static/continuous"),
        _source_key("plus,equals_sign", "more_seqs", "+seq", key_display="+"),
        _source_key("minus", "fewer_seqs", "-seq", key_display="-"),
        _source_key("right_square_bracket", "double_seqs", "×2", show=False, key_display="]"),
        _source_key("left_square_bracket", "halve_seqs", "÷2", show=False, key_display="["),
        _source_key("space", "toggle_pause", "pause"),
        _source_key("less_than_sign", "slower", "slower", key_display="<"),
        _source_key("greater_than_sign", "faster", "faster", key_display=">"),
        _source_key("n", "step", "step", show=False),  # a live engine, paused
        _source_key("n", "next_step", "step"),  # a replay: the recording's next step
        _source_key("b", "burst", "burst"),
        _source_key("r", "restart", "restart", show=False),
        _source_key("g", "seek_start", "start"),
        _source_key("G", "seek_end", "end", key_display="G"),
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
    ENGINE_ONLY = frozenset({"move_slot", "open_slot", "toggle_view", "help"})

    def __init__(self, source: FrameSource, *, theme: str = "batchtop-dark", poll_hz: float = POLL_HZ) -> None:
        super().__init__()
        self.source = source
        self.poll_hz = poll_hz
        for t in THEMES:
            self.register_theme(t)
        self.theme = theme
        self.exit_code = 0
        self.source_error: str | None = None  # why the source's thread died, when it crashed
        self._shown: object = None
        self._shown_state: str | None = None
        self._status_text: Text | None = None
        self._last_paint = float("-inf")
        self._last_status = float("-inf")
        self._sigterm_before = None  # the SIGTERM handler the app replaced while it runs
        source.notify = lambda kind, text: self.post_message(SourceEvent(kind, text))

    @property
    def engine_layout(self) -> bool:
        return self.source.layout == ENGINE_LAYOUT

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        if self.engine_layout:
            from batchtop.tui.widgets.engine.view import EngineView
            yield EngineView(self.source.info)
        else:
            from batchtop.tui.widgets.attach.view import AttachView
            yield AttachView(len(self.source.monitor.urls), self.source.peaks, self.source.peaks_note)
        yield Footer()

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(THEMES[0].variables)  # panels' own variables resolve under any theme

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "source":
            return parameters[0] in self.source.controls
        if action in self.ENGINE_ONLY:
            return self.engine_layout
        return True

    def on_mount(self) -> None:
        self.view = self.query_one("#engine-view" if self.engine_layout else "#attach-view")
        self._status = self.query_one(StatusLine)
        self.set_interval(1 / self.poll_hz, self.poll)
        self.poll()
        self.call_after_refresh(self.run_source)  # the first paint is the costliest: let it finish first
        self._quit_on_sigterm(True)

    def on_unmount(self) -> None:
        self._quit_on_sigterm(False)

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

    @work(thread=True, exit_on_error=False, name="source", group="source")
    def run_source(self) -> None:
        worker = get_current_worker()
        self.source.run(lambda: worker.is_cancelled)

    # -- drawing --------------------------------------------------------------------------------
    def poll(self, force: bool = False) -> None:
        """Show the newest frame: every panel gets the same one (so all show the same step) and
        repaints only if its picture changed.

        On 2 cores every millisecond the UI draws is taken from the engine, so while it runs a new
        frame is shown at most every PAINT_INTERVAL_S; paused, finished or stepped by hand, at once.
        The status line is read again every STATUS_TICK_S even when no frame comes (a first step on
        the torch ops can take a minute): its clocks and counters move, computed as it is painted."""
        if not getattr(self, "view", None) or not self.view.ready:  # not mounted yet, or torn down
            return
        frame = self.source.frame
        state = getattr(frame, "state", None)
        force = force or state != self._shown_state
        now = time.monotonic()
        throttled = state in ("running", "replay") and now - self._last_paint < PAINT_INTERVAL_S
        if force or (frame is not self._shown and not throttled):
            self._shown, self._shown_state, self._last_paint = frame, state, now
            self.view.show(frame, force)
            self._paint_status(frame, force, now)
        elif now - self._last_status >= STATUS_TICK_S:
            self._paint_status(self._shown, False, now)  # the frame on screen: the panels and the line agree

    def _paint_status(self, frame: object, force: bool, now: float) -> None:
        self._last_status = now
        extra = f"stopped: {self.source_error}" if self.source_error else self.source.status(frame)
        text, essential = self.view.status_line(frame, extra)
        if force or text != self._status_text:
            self._status_text = text
            self._status.show(text, essential, getattr(frame, "state", None) or "")

    async def on_source_event(self, event: SourceEvent) -> None:
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
        """A crash in the source must say so: the panels would otherwise sit on the last frame, looking live."""
        if event.worker.name == "source" and event.state is WorkerState.ERROR:
            error = event.worker.error
            self.source_error = f"{type(error).__name__}: {error}"
            self.exit_code = 1
            what = "engine" if self.engine_layout else "attach"
            self.notify(f"{what} stopped: {self.source_error}", title=f"{what} stopped", severity="error", timeout=30)
            self.poll(force=True)

    # -- keys -------------------------------------------------------------------------------------
    def action_source(self, control: str) -> None:
        message = self.source.act(control)
        if message:
            self.notify(message, timeout=2)
        self.poll(force=True)

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
        self.view.repaint_after_theme_change()
        self.poll(force=True)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_save_svg(self) -> None:
        save_screenshot(self, "batchtop" if self.engine_layout else "batchtop_attach")

    async def action_quit(self) -> None:
        """Let the source's thread finish its step (and close a recording) before the app goes."""
        self.source.stop()
        for _ in range(int(QUIT_WAIT_S / 0.02)):
            if self.source.done.is_set():
                break
            await asyncio.sleep(0.02)
        self.workers.cancel_group(self, "source")
        self.exit(self.exit_code)
