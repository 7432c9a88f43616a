"""Ctrl-C and SIGTERM end a run at the next step boundary, so what finished is measured and a trace
closes with its end event; before and after a run they end the process (see tui.cli).

A second Ctrl-C during a run stops at once (KeyboardInterrupt), for a step that never ends.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from batchtop.core_engine.torch_thread import still_running

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


def stopped(signum: int) -> NoReturn:
    """The one line, then exit 128 + signum; at once (os._exit, after flushing) while a build thread is
    still inside torch, whose C++ would abort an interpreter shutting down around it."""
    print(f"batchtop: stopped by {signal.Signals(signum).name}", file=sys.stderr, flush=True)
    if still_running():
        sys.stdout.flush()
        os._exit(exit_status(signum))
    sys.exit(exit_status(signum))


def signal_of(exc: KeyboardInterrupt) -> int:
    return signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT
