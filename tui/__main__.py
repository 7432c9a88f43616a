"""The `batchtop` console script's first code (and `python -m batchtop.tui`'s): signal handlers before any heavy import.

tui.cli imports click, torch and the engine (about 1.5 s) before it can install its handlers. In that
window Ctrl-C printed a 14-57-line traceback, SIGTERM killed the process without a word, and a `cmd &`
job of a script (started with SIGINT ignored) lost its Ctrl-C and ran to the end. Here, from the first
line, SIGINT raises KeyboardInterrupt and SIGTERM Terminated; either during the imports exits 130 / 143
with one line, and one that an import swallowed (a bare `except:`) is still honoured once they end.
This module imports nothing but the standard library and run/stop.py (which needs no torch).
"""

from __future__ import annotations

import os
import signal
import threading

from batchtop.core_engine.run.stop import Terminated, signal_of, stopped

_caught: list[int] = []  # signals taken while importing, in case an import swallowed the exception

# OpenMP's worker threads (torch's, and the C++ kernels' parallel loops) spin ~300,000 times waiting for
# work before they sleep. On a machine other work shares, two spinning threads on two busy cores starve
# each other: the default headless run made 70 tok/s beside three busy processes where it makes 574-670
# idle. A spin of 10,000 keeps the idle speed (655) and gives 127-131 loaded; OMP_WAIT_POLICY=PASSIVE
# gives 185 loaded but costs 27% idle (417). Read by libgomp when torch loads it: set before any import.
# A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
SPIN_COUNT = "10000"


def _while_importing(signum: int, frame) -> None:
    _caught.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def shorten_openmp_spin(environ) -> None:
    if "OMP_WAIT_POLICY" not in environ:
        environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)


def main() -> None:
    """The `batchtop` console script (and `python -m batchtop.tui`)."""
    shorten_openmp_spin(os.environ)
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
