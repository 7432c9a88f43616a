"""A batchtop server's step stream as a frame source: the engine's own panels (slots, KV blocks, waiting
with reasons, roofline), drawn from the snapshots the server's engine made, through the same
FrameBuilder a live engine and a replay use. Read-only: a key that would change the engine is refused
with a notice (it changes the engine where it runs). Ends, saying so, when the stream does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from batchtop.core_engine.attach.engine_stream import EngineStream, StreamItem
from batchtop.core_engine.run.frame import DashboardFrame, FrameBuilder, restarted
from batchtop.core_engine.trace.schema import engine_header
from batchtop.tui.sources.live import LIVE_CONTROLS, PUBLISH_INTERVAL_S
from batchtop.tui.sources.source import ENGINE_LAYOUT, EngineInfo, Notify


class StreamSource:
    layout = ENGINE_LAYOUT
    controls = LIVE_CONTROLS  # accepted only to be refused with a notice: the footer shows what they are

    def __init__(self, stream: EngineStream) -> None:
        """stream: open, its header read: the panels are laid out for the engine it names."""
        self.stream = stream
        self.header = stream.header
        config, peaks = engine_header(self.header)
        device = (self.header.get("device") or {}).get("name", config.device)
        self.info = EngineInfo(config, peaks, f"{device} (streamed)", live=False, workload=self.header.get("workload"),
                               no_telemetry="streamed from the server: its device's telemetry stays there")
        self.notify: Notify = lambda kind, text: None
        self.done = threading.Event()
        self.dropped = 0  # steps the server dropped for this viewer (it resynced after each gap)
        self.ended: str | None = None  # why the stream ended, once it has
        self._builder = FrameBuilder()
        self._stop = False
        self._unshown = False  # a snapshot arrived that no published frame holds yet
        self._last_publish = 0.0
        self.frame: DashboardFrame = self._builder.frame("idle")

    @property
    def url(self) -> str:
        return self.stream.url

    def run(self, is_cancelled: Callable[[], bool]) -> None:
        try:
            for item in self.stream.items():
                if self._stop or is_cancelled():
                    break
                if item.end is not None:
                    self._end(item.end)
                    break
                if item.snapshot is None:  # a heartbeat: the newest step, if it was held back
                    self._publish(force=self._unshown)
                else:
                    self._observe(item)
        finally:
            self.stream.close()
            self.done.set()

    def stop(self) -> None:
        self._stop = True
        self.stream.interrupt()  # a read waiting for the next line ends now, not at the next heartbeat

    def _observe(self, item: StreamItem) -> None:
        snap = item.snapshot
        assert snap is not None
        if item.synced:
            self.dropped = item.dropped
        if restarted(snap):
            self._builder = FrameBuilder()
        self._builder.observe(snap)
        self._publish(force=not snap.is_step or item.synced)

    def _end(self, reason: str) -> None:
        self.ended = reason
        self._publish(force=True)
        self.notify("info", f"the stream of {self.url} ended: {reason}")

    def _state(self) -> str:
        if self.ended is not None:
            return "finished"
        snap = self._builder.last
        if snap is None or not (snap.num_running or snap.num_waiting or snap.num_pending_arrivals):
            return "idle"
        return "running"

    def _publish(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_publish < PUBLISH_INTERVAL_S:
            self._unshown = True
            return
        self._last_publish, self._unshown = now, False
        self._builder.sample_rate()
        self.frame = self._builder.frame(self._state())

    # -- keys (the UI thread) ---------------------------------------------------------------------
    def act(self, name: str) -> str:
        return (f"read-only: this is a live stream of {self.url}; keys that change the engine work where it "
                "runs (its own dashboard)")

    def status(self, frame: DashboardFrame) -> str:
        if self.ended is not None:
            return f"■ stream of {self.url} ended: {self.ended}"
        parts = [f"● live stream of {self.url}"]
        if self.dropped:
            parts.append(f"{self.dropped} steps dropped (resynced)")
        if self.stream.num_bad_lines:
            parts.append(f"{self.stream.num_bad_lines} bad lines skipped")
        return " · ".join(parts)
