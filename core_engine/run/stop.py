"""Ctrl-C and SIGTERM end a run at the next step boundary, so what finished is measured and a trace
closes with its end event; before and after a run they end the process (see tui.cli).

A second Ctrl-C during a run stops at once (KeyboardInterrupt), for a step that never ends.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM outside a run: unwinds like Ctrl-C, exits 128 + SIGTERM."""


def exit_status(signum: int) -> int:
    """The shell's convention: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + signum


def raise_terminated(signum: int, frame) -> None:
    raise Terminated()


class StopRequest:
    """Set by a signal handler, read by the driver between steps."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __bool__(self) -> bool:
        return self.signal is not None

    def _handle(self, signum: int, frame) -> None:
        if self.signal == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt  # asked twice: do not wait for the step
        self.signal = self.signal or signum

    @contextmanager
    def installed(self) -> Iterator[StopRequest]:
        """Catch SIGINT and SIGTERM while the run lasts (main thread only; elsewhere nothing changes)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
