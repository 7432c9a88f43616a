"""Keep PyTorch's CPU work off the main thread when another thread will drive the engine.

Measured with torch 2.13's OpenMP build: once the main thread has run one parallel region, every
parallel region started from any other thread costs ~50 us more (an elementwise op goes from ~10 us
to ~60 us; a decode step gets ~20% slower). The dashboard's engine runs in a worker thread while
the main thread draws, so everything that touches torch there is built in a worker thread too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


_running: set[threading.Thread] = set()  # threads still inside their fn (Thread.is_alive() is no guide:
# a join() interrupted by a signal marks its thread stopped while it runs on)


def still_running() -> bool:
    """Whether a call_in_thread thread is still inside its function: its caller was interrupted (a
    signal while a model builds). The process must then leave by os._exit: an interpreter shutting down
    around a thread inside torch's C++ aborts ("terminate called without an active exception", 134)."""
    return bool(_running)


def call_in_thread(fn: Callable[[], T]) -> T:
    """Run fn on a short-lived thread and return its result (or raise its exception) here."""
    result: list = []
    error: list[BaseException] = []

    def body() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # re-raised on the caller's thread, KeyboardInterrupt included
            error.append(exc)
        finally:
            _running.discard(threading.current_thread())

    thread = threading.Thread(target=body, name="batchtop-build", daemon=True)
    _running.add(thread)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
