"""The `batchtop` console script's first code (and `python -m batchtop.tui`'s): signal handlers before any heavy import.

tui.cli imports click, torch and the engine (about 1.5 s) before it can install its handlers. In that
window Ctrl-C printed a 14-57-line traceback, SIGTERM killed the process without a word, and a `cmd &`
job of a script (started with SIGINT ignored) lost its Ctrl-C and ran to the end. Here, from the first
line, SIGINT raises KeyboardInterrupt and SIGTERM Terminated; either during the imports exits 130 / 143
with one line, and one that an import swallowed (a bare `except:`) is still honoured once they end.
This module imports nothing but the standard library and run/stop.py (which needs no torch).
"""

from __future__ import annotations

import signal
import threading

from batchtop.core_engine.run.stop import Terminated, signal_of, stopped

_caught: list[int] = []  # signals taken while importing, in case an import swallowed the exception


def _while_importing(signum: int, frame) -> None:
    _caught.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def main() -> None:
    """The `batchtop` console script (and `python -m batchtop.tui`)."""
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


if __name__ == "__main__":
    main()
