"""A recorded session as a frame source: its TracePlayer stepped by the same RunLoop as a live engine,
at recorded speed (paced), into the same FrameBuilder, so the panels cannot tell live from replay."""

from __future__ import annotations

import threading
from collections.abc import Callable

from batchtop.core_engine.run.loop import RunLoop, Stepped
from batchtop.core_engine.run.playback_speed import WallPace
from batchtop.core_engine.run.trace_player import TracePlayer
from batchtop.core_engine.trace.schema import engine_header
from batchtop.core_engine.trace.trace import Trace
from batchtop.core_engine.run.frame import DashboardFrame, FrameBuilder, restarted
from batchtop.tui.sources.source import ENGINE_LAYOUT, EngineInfo, Notify

MAX_REPLAY_SPEED = 64.0


class ReplaySource:
    layout = ENGINE_LAYOUT
    controls = frozenset({"toggle_pause", "slower", "faster", "next_step", "seek_start", "seek_end"})

    def __init__(self, trace: Trace, *, speed: float = 1.0, start_paused: bool = False) -> None:
        """The trace's header must hold an engine's config (engine_header raises HeaderError otherwise)."""
        self.trace = trace
        config, peaks = engine_header(trace.header)
        device = (trace.header.get("device") or {}).get("name", config.device)
        how = "simulated, recorded" if trace.header.get("simulated") else "recorded"
        self.info = EngineInfo(config, peaks, f"{device} ({how})", live=False, workload=trace.header.get("workload"))
        self.notify: Notify = lambda kind, text: None
        self.player = TracePlayer(trace, on_error=lambda message: self.notify("error", message))
        self.pace = WallPace(self.player.clock, speed, max_speed=MAX_REPLAY_SPEED)
        self.loop = RunLoop(self.player, until_done=False, time=self.pace, on_step=self._on_step,
                            on_idle=self._publish, on_restart=self._on_restart, paused=start_paused)
        self._builder = FrameBuilder()
        self.frame: DashboardFrame = self._frame()

    @property
    def done(self) -> threading.Event:
        return self.loop.done

    @property
    def paused(self) -> bool:
        return self.loop.paused

    @property
    def pos(self) -> int:
        return self.player.pos

    def run(self, is_cancelled: Callable[[], bool]) -> None:
        self.loop.run(is_cancelled)

    def stop(self) -> None:
        self.loop.stop()

    def _on_step(self, item: Stepped, forced: bool) -> None:
        if restarted(item.snapshot):
            self._builder = FrameBuilder()
        self._builder.observe(item.snapshot, item.text)
        self._builder.sample_rate()
        self._publish()

    def _on_restart(self, item: Stepped | None) -> None:
        self._builder = FrameBuilder()
        self.pace.hold()
        self._publish()

    def _seek_end(self) -> None:
        for item in self.player.play_to_end():
            self._builder.observe(item.snapshot, item.text)
        self.pace.hold()
        self._publish()

    def _frame(self) -> DashboardFrame:
        state = "paused" if self.loop.paused else "finished" if self.player.is_done() else "replay"
        return self._builder.frame(state, None, self.player.caption)

    def _publish(self) -> None:
        self.frame = self._frame()

    # -- keys (the UI thread) ---------------------------------------------------------------------
    def act(self, name: str) -> str | None:
        if name == "toggle_pause":
            self.loop.toggle_pause()
            self._publish()
        elif name == "next_step":
            if not self.loop.paused:
                self.loop.toggle_pause()
            self.loop.step_once()
        elif name in ("slower", "faster"):
            speed = self.pace.slower() if name == "slower" else self.pace.faster()
            self.loop.wake()
            return f"replay at {speed:g}x"
        elif name == "seek_start":
            self.loop.restart()
        elif name == "seek_end":
            self.loop.call_soon(self._seek_end)
        return None

    def status(self, frame: DashboardFrame) -> str:
        parts = [self.position()]
        if self.player.recorded_pause:
            parts.append("paused in the recording")
        if frame.caption:
            parts.append(frame.caption)
        return " │ ".join(parts)

    def position(self) -> str:
        snap = self.frame.snapshot
        step = snap.counters.steps if snap is not None else 0
        return (f"REPLAY {self.pace.speed:g}x · step {step}/{self.player.num_steps} · "
                f"{self.player.clock():.1f}/{self.player.duration:.1f}s")
