"""The status line: mode, max_num_seqs, device and model, and whether the engine runs.

What depends on time (the clock since launch, a step's seconds in flight, the kernels' build) is read
from the wall clock when the line is painted, so it moves however long the engine takes to publish a
frame. What a key asked for shows at once, marked pending until the engine has applied it.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from batchtop.core_engine.config import EngineConfig
from batchtop.tui.sources import wall
from batchtop.core_engine.run.frame import DashboardFrame
from batchtop.tui.sources.pending import Pending

STATE_LABEL = {"running": "● running", "paused": "‖ paused", "finished": "■ finished", "error": "✖ engine stopped",
               "replay": "▶ replay", "idle": "○ idle", "loading": "◌ loading"}
CLOCKED = ("running", "loading")  # states whose label carries the clock since launch (it moves: not hung)
PAUSING = "‖ pausing after this step"


def state_label(state: str, pending: Pending) -> str:
    if pending.paused:
        return PAUSING
    if pending.paused is False:  # resumed: the loop runs now, the frame says so once its step ends
        state = "running"
    label = STATE_LABEL.get(state, state)
    return f"{label} {wall.clock_text(wall.since_launch())}" if state in CLOCKED else label


def _to(value: object) -> str:
    return "" if value is None else f" → {value}"


def status_text(frame: DashboardFrame, config: EngineConfig, device_label: str,
                extra: str = "") -> tuple[Text, int]:
    """The line, and how many cells of it must stay visible (through the caption or error)."""
    snap = frame.snapshot
    mode = snap.mode if snap is not None else config.mode
    max_num_seqs = snap.max_num_seqs if snap is not None else config.max_num_seqs
    pending = frame.pending
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f" mode={mode}{_to(pending.mode)} ", "bold reverse")
    text.append(f" max_num_seqs={max_num_seqs}{_to(pending.max_num_seqs)} ", "bold")
    if pending.mode is not None or pending.max_num_seqs is not None:
        text.append("(in the step in flight) " if pending.in_flight else "(at next step) ", "italic")
    text.append(f"│ {state_label(frame.state, pending)} ", "bold")
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
