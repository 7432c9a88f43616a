"""The session as the dashboard's run loop steps it, watched from the engine thread: when the step in
flight began (the status line counts its seconds at paint time, however long the step takes) and how
many of the keys' commands had been sent when it began (exactly the ones it applies: the engine drains
its control queue first thing in a step)."""

from __future__ import annotations

from collections.abc import Callable

from batchtop.core_engine.run.loop import Stepped
from batchtop.core_engine.run.live_session import Session
from batchtop.tui.sources import wall
from batchtop.tui.sources.pending import SentControls


class WatchedSession:
    """A Session for core_engine.run.loop.RunLoop (everything else is the session's own)."""

    def __init__(self, session: Session, sent: SentControls, steps_done: Callable[[], int]) -> None:
        self._session = session
        self._sent = sent
        self._steps_done = steps_done
        self.taken = 0  # the keys' commands the engine had been sent when it last took its controls
        self.in_flight: tuple[int, float] | None = None  # (the step's number, wall.now() when it began)

    def __getattr__(self, name: str):
        return getattr(self._session, name)

    def step(self, forced: bool) -> Stepped:
        self.in_flight = (self._steps_done() + 1, wall.now())
        # a few instructions before the engine drains its queue: a key pressed in between is applied
        # by this step but shows as pending until the next one publishes (microseconds a step)
        self.taken = self._sent.mark()
        try:
            return self._session.step(forced)
        finally:
            self.in_flight = None

    def apply_controls(self) -> Stepped | None:
        self.taken = self._sent.mark()
        return self._session.apply_controls()

    def restart(self) -> Stepped:
        self.taken = self._sent.mark()
        return self._session.restart()
