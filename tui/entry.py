"""The `batchtop` console script's first code: signal handlers before any heavy import.

tui.cli imports click, torch and the engine (about 1.5 s) before it can install its handlers. In that
window Ctrl-C printed a 14-57-line traceback, SIGTERM killed the process without a word, and a `cmd &`
job of a script (started with SIGINT ignored) lost its Ctrl-C and ran to the end. Here, from the first
line, SIGINT raises KeyboardInterrupt and SIGTERM Terminated; either during the imports exits 130 / 143
with one line, and one that an import swallowed (a bare `except:`) is still honoured once they end.
This module imports nothing but the standard library and two small modules of the engine.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import NoReturn

from batchtop.core_engine.run.stop import Terminated, exit_status
from batchtop.core_engine.torch_thread import still_running

_caught: list[int] = []  # signals taken while importing, in case an import swallowed the exception


def _while_importing(signum: int, frame) -> None:
    _caught.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


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


def main() -> None:
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _while_importing)
    try:
        from batchtop.tui.cli import main as cli
    except KeyboardInterrupt as exc:
        stopped(signal_of(exc))
    if _caught:
        stopped(_caught[0])
    cli()
