"""The server's engine thread when there is no dashboard: step while there is work, sleep until there is.

Unlike the headless driver it does not end when the work runs out: it waits for the next request on
an event the hub sets (never a busy loop) until it is stopped. The dashboard's EngineBridge does the
same job when a screen is open.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from batchtop.core_engine.run.session import Session

SCRIPT_POLL_S = 0.05  # idle with a demo script: wake up to play its next action on time


class EngineLoop:
    def __init__(self, session: Session, on_exit: Callable[[], None] | None = None) -> None:
        self.session = session
        self.on_exit = on_exit  # called on the engine thread when it leaves for any reason but stop()
        self.error: str | None = None
        self.done = threading.Event()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.run, name="batchtop-engine", daemon=True)
        session.engine.load_workload(session.workload)  # a workload replayed beside the clients

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Thread-safe: work has arrived."""
        self._wake.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finish the step in flight, close the session (and its trace), and wait for the thread."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def run(self) -> None:
        engine = self.session.engine
        idle_timeout = None if self.session.script is None else SCRIPT_POLL_S
        try:
            while not self._stop.is_set():
                self._wake.clear()  # before looking for work, so a wake that comes after is never lost
                self.session.before_step()
                if self.session.quit_requested:
                    break
                if not engine.is_done():
                    snap = engine.step()
                    self.session.after_step(snap)
                    if snap.is_step:
                        continue
                # nothing to run: sleep until the next workload arrival, or until a request wakes us
                until = engine.seconds_until_next_arrival()
                self._wake.wait(idle_timeout if until is None else until)
            self.session.close("script quit" if self.session.quit_requested else "shutdown")
        except Exception as exc:  # the engine is dead: in-flight requests get 500, /health turns unhealthy
            self.error = f"{type(exc).__name__}: {exc}"
            self.session.close("error", self.error)
        finally:
            self.done.set()
            if self.on_exit is not None and not self._stop.is_set():
                self.on_exit()
