"""The dashboard before its engine exists: the panels are up within seconds while the model loads on the
worker thread (a GGUF file dequantizes in a few seconds), then every call goes to the live EngineSource
it prepared. Its status line says what is being prepared, and, on a CPU, how the background build of
the C++ kernels is going and when they came in.

Nothing here touches a widget; a failure to prepare (a damaged model file) is shown and kept for the
command to report once the app has closed (`failure`, exit code 2 for bad input).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from batchtop.gpu_kernels import cpu_kernels
from batchtop.gpu_kernels.cpu_kernel_build import SOURCES
from batchtop.tui.sources import wall
from batchtop.core_engine.run.frame import DashboardFrame, LiveMetrics
from batchtop.tui.sources.live import LIVE_CONTROLS, EngineSource
from batchtop.tui.sources.source import ENGINE_LAYOUT, EngineInfo, Notify

Say = Callable[[str], None]
KERNELS_NOTE_S = 15.0  # how long the status line says the kernels have just come in


class PrepareFailed(Exception):
    """What `prepare` raises for input it cannot use (exit code 2), with the message for the user."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class PreparingSource:
    layout = ENGINE_LAYOUT

    def __init__(self, info: EngineInfo, prepare: Callable[[Say], EngineSource], *,
                 kernels: bool = False) -> None:
        """prepare: builds the live source on the worker thread, saying what it does as it goes.
        kernels: a CPU run whose kernels may be building in the background (the status line follows the build)."""
        self.info = info
        self.controls = LIVE_CONTROLS
        self.notify: Notify = lambda kind, text: None
        self.done = threading.Event()
        self.failure: tuple[int, str] | None = None  # (exit code, message) when preparing failed
        self._prepare = prepare
        self._kernels = kernels and cpu_kernels.background_state() is not None  # a build to follow
        self._kernels_in_at: float | None = None
        self._inner: EngineSource | None = None
        self._stopped = False
        self._message = "starting…"
        self._started = wall.now()
        self._loading = DashboardFrame(None, LiveMetrics(), state="loading")

    @property
    def frame(self) -> DashboardFrame:
        return self._inner.frame if self._inner is not None else self._loading

    @property
    def inner(self) -> EngineSource | None:
        return self._inner

    @property
    def preparing(self) -> bool:
        """Whether the worker thread is still building the engine (inside torch)."""
        return self._inner is None and self.failure is None and not self.done.is_set()

    def _say(self, message: str) -> None:
        self._message = message
        self._loading = DashboardFrame(None, LiveMetrics(), state="loading")  # a new frame: the app repaints

    # -- the worker thread ----------------------------------------------------------------------
    def run(self, is_cancelled: Callable[[], bool]) -> None:
        try:
            try:
                inner = self._prepare(self._say)
            except PrepareFailed as exc:
                self._fail(exc.code, exc.message)
                return
            except Exception as exc:  # the engine could not be built: say why, keep the screen up
                self._fail(1, f"{type(exc).__name__}: {exc}")
                return
            inner.notify = self.notify
            self._inner = inner
            if self._stopped or is_cancelled():
                inner.stop()
            inner.run(lambda: is_cancelled() or self._stopped)
        finally:
            self.done.set()

    def _fail(self, code: int, message: str) -> None:
        self.failure = (code, message)
        self._loading = DashboardFrame(None, LiveMetrics(), state="error", error=message)
        self.notify("error", message)

    def stop(self) -> None:
        self._stopped = True
        if self._inner is not None:
            self._inner.stop()

    @property
    def error(self) -> str | None:
        """The engine's error once it runs; why preparing failed before."""
        if self._inner is not None:
            return self._inner.error
        return self.failure[1] if self.failure is not None else None

    def shut_down(self, reason: str, wait_s: float) -> None:
        """However the app ended: stop preparing (a model still loading is left to finish on its daemon
        thread, which then stops at once), and close the live source's session (EngineSource.shut_down)."""
        self.stop()
        if self._inner is None:
            self.done.wait(min(wait_s, 1.0))
        if self._inner is not None:
            self._inner.shut_down(reason, wait_s)

    # -- keys and the status line ------------------------------------------------------------------
    def act(self, name: str) -> str | None:
        if self._inner is None:
            return f"the engine is not ready yet: {self._message}"
        return self._inner.act(name)

    def status(self, frame: DashboardFrame) -> str:
        if self._inner is None:
            if self.failure is not None:
                return f"could not start: {self.failure[1]}"
            return f"{self._message} ({wall.now() - self._started:.0f} s)"
        flight = self._inner.step_in_flight()
        kernels, says_step = self._kernel_status(flight)
        parts = [p for p in (self._inner.status(frame, step_note=not says_step), kernels) if p]
        return " · ".join(parts)

    def _kernel_status(self, flight: tuple[int, float] | None) -> tuple[str, bool]:
        """The kernels' part of the status line, and whether it tells the step in flight too (a step that
        is slow because the kernels are still building: one line says both)."""
        if not self._kernels:
            return "", False
        state = cpu_kernels.background_state()
        if state is not None and state.phase in ("waiting", "building"):
            steps = f"{state.done}/{state.total}" if state.total else f"0/{len(SOURCES) + 1}"
            build = f"({steps} done, {wall.now() - state.started:.0f} s)"
            if flight is not None:
                number, seconds = flight
                step = "first step" if number == 1 else f"step {number}"
                return f"{step}: {seconds:.0f} s, running torch ops while the C++ kernels build {build}", True
            return f"CPU kernels building {build}: torch ops meanwhile", False
        if state is not None and state.phase == "built" and not cpu_kernels.active():
            return "CPU kernels built: they come in after the step in flight", False
        if cpu_kernels.active():
            if self._kernels_in_at is None:
                self._kernels_in_at = wall.now()
            if wall.now() - self._kernels_in_at < KERNELS_NOTE_S:
                return "CPU kernels in: the steps run batchtop's C++ kernels now", False
            return "", False
        return f"CPU kernels unavailable ({cpu_kernels.why_unavailable()}): torch ops", False
