"""The server's engine thread when there is no dashboard: the RunLoop over its Session, stepping while
there is work and sleeping until a request wakes it (never a busy loop), until it is stopped."""

from __future__ import annotations

import threading
from collections.abc import Callable

from batchtop.core_engine.run.loop import RunLoop
from batchtop.core_engine.run.live_session import Session


class EngineThread:
    def __init__(self, session: Session, on_exit: Callable[[], None] | None = None) -> None:
        self.session = session
        self.on_exit = on_exit  # called on the engine thread when it leaves for any reason but stop()
        self.error: str | None = None
        self.loop = RunLoop(session, until_done=False, stop_reason="shutdown", max_wait_s=None)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="batchtop-engine", daemon=True)
        session.engine.load_workload(session.workload)  # a workload replayed beside the clients

    @property
    def done(self) -> threading.Event:
        return self.loop.done

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Thread-safe: work has arrived."""
        self.loop.wake()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finish the step in flight, close the session (and its trace), and wait for the thread."""
        self._stopping = True
        self.loop.stop()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        end = self.loop.run()
        if end.reason == "error":  # in-flight requests get 500, /health turns unhealthy
            self.error = end.error_text
        if self.on_exit is not None and not self._stopping:
            self.on_exit()
