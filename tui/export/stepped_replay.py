"""A recording stepped by the exporter, not by the wall clock: the same TracePlayer and FrameBuilder a
replay uses, moved to each frame's time by hand, so an export is deterministic and never waits."""

from __future__ import annotations

from collections.abc import Callable

from batchtop.core_engine.run.frame import FrameBuilder, restarted
from batchtop.tui.sources.replay import ReplaySource

class SteppedReplay(ReplaySource):
    controls = frozenset()  # nobody presses keys in an export

    def run(self, is_cancelled: Callable[[], bool]) -> None:
        """The app's worker thread has nothing to do: `advance_to` plays the recording. It has left at
        once, so a quit (SIGTERM) does not wait for it."""
        self.loop.done.set()

    def advance_to(self, t: float) -> None:
        """Play every recorded item due by t seconds of the recording, then publish the frame there."""
        for item in self.player.play_until(t):  # as _on_step folds them, with one frame built at the end
            if restarted(item.snapshot):
                self._builder = FrameBuilder()
            self._builder.observe(item.snapshot, item.text)
            self._builder.sample_rate()
        self._publish()

    @property
    def duration(self) -> float:
        return self.player.duration
