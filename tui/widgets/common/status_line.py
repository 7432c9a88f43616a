"""The status line: mode, max_num_seqs, device and model, and whether the engine runs."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from batchtop.core_engine.config import EngineConfig
from batchtop.tui.sources.frame import DashboardFrame

STATE_LABEL = {"running": "● running", "paused": "‖ paused", "finished": "■ finished", "error": "✖ engine stopped",
               "replay": "▶ replay", "idle": "○ idle", "loading": "◌ loading"}


def status_text(frame: DashboardFrame, config: EngineConfig, device_label: str,
                extra: str = "") -> tuple[Text, int]:
    """The line, and how many cells of it must stay visible (through the caption or error)."""
    snap = frame.snapshot
    mode = snap.mode if snap is not None else config.mode
    max_num_seqs = snap.max_num_seqs if snap is not None else config.max_num_seqs
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f" mode={mode} ", "bold reverse")
    text.append(f" max_num_seqs={max_num_seqs} ", "bold")
    text.append(f"│ {STATE_LABEL.get(frame.state, frame.state)} ", "bold")
    if extra:  # a replay's position, a demo's caption or the engine's error: ahead of the fixed facts
        text.append(f"│ {extra} ", "bold")
    essential = text.cell_len
    if snap is not None:
        text.append(f"│ step {snap.counters.steps} · t {snap.t:.1f}s ")
    text.append(f"│ {config.model.name} · {config.dtype} · {device_label} ")
    return text, essential


class StatusLine(Static):
    """One row; a caption or error too long for it wraps onto a second row rather than being cut off
    (the fixed facts after it are cut with an ellipsis instead)."""

    _shown: tuple[Text, int, str] | None = None

    def show(self, text: Text, essential: int, state: str) -> None:
        self._shown = (text, essential, state)
        rows = 1 if essential <= self.size.width or not self.size.width else 2
        text.no_wrap = rows == 1
        if self.styles.height is None or self.styles.height.value != rows:
            self.styles.height = rows  # a relayout, but only when a long caption comes or goes
        self.update(text, layout=False)
        self.set_class(state == "error", "-error")
        self.set_class(state == "paused", "-paused")

    def on_resize(self) -> None:
        if self._shown is not None:
            self.show(*self._shown)
