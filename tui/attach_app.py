"""The attach dashboard: batchtop's panels over a live server's /metrics (or a recording of them).

A worker thread scrapes (or replays) and hands each frame to the UI, which shows it in every panel at
once; nothing here talks to a server. Layout only in CSS; every colour is a theme variable.
"""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Footer, Static
from textual.worker import get_current_worker

from batchtop.core_engine.attach.monitor import AttachFrame
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.themes import STYLESHEET, THEMES, next_theme
from batchtop.tui.screenshot import save_screenshot
from batchtop.tui.widgets.attach.format import short_url
from batchtop.tui.widgets.attach.kv import AttachKVPanel
from batchtop.tui.widgets.attach.metrics_strip import AttachMetricsStrip
from batchtop.tui.widgets.attach.replicas import AttachReplicasPanel
from batchtop.tui.widgets.attach.roofline import AttachRooflinePanel
from batchtop.tui.widgets.attach.slots import AttachSlotsPanel
from batchtop.tui.widgets.attach.waiting import AttachWaitingPanel

FLAVOUR_LABEL = {"vllm": "vLLM", "sglang": "SGLang", "batchtop": "batchtop serve", "mixed": "mixed servers"}

LAYOUT = """
#attach-status { height: 1; background: $panel; color: $foreground; }
#attach-top { height: 3fr; }
#attach-bottom { height: 3fr; }
#attach-slots { width: 3fr; }
#attach-kv { width: 2fr; }
#attach-waiting { width: 2fr; }
#attach-roofline { width: 3fr; }
#attach-metrics { height: 3; background: $panel; color: $foreground; text-wrap: nowrap; }
"""


class AttachApp(App[int]):
    CSS_PATH = STYLESHEET
    CSS = LAYOUT
    TITLE = "batchtop attach"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("space", "toggle_pause", "pause"),
        Binding("less_than_sign", "slower", "slower", key_display="<"),
        Binding("greater_than_sign", "faster", "faster", key_display=">"),
        Binding("n", "step", "step"),
        Binding("t", "next_theme", "theme"),
        Binding("p", "save_svg", "screenshot"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, feed, peaks: DevicePeaks | None, peaks_note: str, *, theme: str = "batchtop-dark") -> None:
        super().__init__()
        self.feed = feed  # LiveFeed or ReplayFeed
        self.peaks, self.peaks_note = peaks, peaks_note
        for t in THEMES:
            self.register_theme(t)
        self.theme = theme
        self.frame: AttachFrame | None = None
        self._panels: list = []

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action in ("toggle_pause", "slower", "faster", "step"):
            return not self.feed.LIVE  # a live server cannot be paused from here
        return True

    def compose(self) -> ComposeResult:
        yield Static(id="attach-status")
        yield AttachReplicasPanel()
        with Horizontal(id="attach-top"):
            yield AttachSlotsPanel()
            yield AttachKVPanel()
        with Horizontal(id="attach-bottom"):
            yield AttachWaitingPanel()
            yield AttachRooflinePanel(self.peaks, self.peaks_note)
        yield AttachMetricsStrip(id="attach-metrics")
        yield Footer()

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(THEMES[0].variables)

    def on_mount(self) -> None:
        self._panels = [self.query_one(p) for p in (AttachReplicasPanel, AttachSlotsPanel, AttachKVPanel,
                                                     AttachWaitingPanel, AttachRooflinePanel)]
        self._metrics = self.query_one(AttachMetricsStrip)
        rows = len(self.feed.monitor.urls)
        self.query_one(AttachReplicasPanel).styles.height = min(14, 3 + rows + (2 if rows > 1 else 0))
        self._status = self.query_one("#attach-status", Static)
        self._status.update(Text(f" batchtop attach │ {self.feed.status()} │ waiting for the first scrape"))
        self.run_feed()

    def on_unmount(self) -> None:
        self._panels = []
        self.feed.stop()

    @work(thread=True, exit_on_error=False, name="attach", group="attach")
    def run_feed(self) -> None:
        worker = get_current_worker()

        def hand_over(frame: AttachFrame) -> None:
            if not worker.is_cancelled:
                try:
                    self.call_from_thread(self.show_frame, frame)
                except RuntimeError:  # the app closed while this frame was on its way
                    pass

        self.feed.run(hand_over, lambda: worker.is_cancelled)
        if not self.feed.LIVE and not worker.is_cancelled:
            self.call_from_thread(self.refresh_status)

    def show_frame(self, frame: AttachFrame) -> None:
        if not self._panels:
            return
        self.frame = frame
        for panel in self._panels:
            panel.show(frame)
        self._metrics.show(frame)
        self.refresh_status()

    def refresh_status(self) -> None:
        frame = self.frame
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(" batchtop attach ", "bold reverse")
        if frame is not None:
            m = frame.main
            what = FLAVOUR_LABEL.get(m.flavour or "", "no server yet")
            where = short_url(frame.replicas[0].name) if len(frame.replicas) == 1 else f"{len(frame.replicas)} replicas"
            text.append(f" {what} · {where} · {m.model_name or '?'} ", "bold")
            text.append(f"│ {m.status} ")
        text.append(f"│ {self.feed.status()} ")
        if frame is not None:
            text.append(f"│ scrape {frame.tick} · t {frame.t:.0f}s")
        self._status.update(text)

    # -- keys -----------------------------------------------------------------------------------
    def action_toggle_pause(self) -> None:
        self.feed.toggle_pause()
        self.refresh_status()

    def action_step(self) -> None:
        self.feed.step_once()

    def action_slower(self) -> None:
        self.notify(f"replay at {self.feed.slower():g}x", timeout=1.5)

    def action_faster(self) -> None:
        self.notify(f"replay at {self.feed.faster():g}x", timeout=1.5)

    def action_next_theme(self) -> None:
        self.theme = next_theme(self.theme)
        for panel in self._panels:
            panel.show(self.frame, force=True) if self.frame is not None else panel.refresh()

    def action_save_svg(self) -> None:
        save_screenshot(self, "batchtop_attach")
