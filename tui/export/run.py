"""The export driver: the dashboard run headless at a fixed size over a SteppedReplay, moved frame by
frame through the recording's time (no waiting on the wall clock), each screen handed to the writer."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable

from textual.pilot import Pilot

from batchtop.tui.app import BatchtopApp
from batchtop.tui.export.animated_svg import SvgWriter
from batchtop.tui.export.asciicast import CastWriter, unix_time
from batchtop.tui.export.options import ExportPlan
from batchtop.tui.export.screen import Grid, screen_grid
from batchtop.tui.export.stepped_replay import SteppedReplay

PROGRESS_TTY_S, PROGRESS_LOG_S = 0.5, 10.0


def frame_times(duration: float, fps: float, speed: float = 1.0) -> list[float]:
    """Recorded times of the frames: every speed/fps seconds of the recording, and its very end (the
    finished picture)."""
    every = speed / fps
    times = [k * every for k in range(math.floor(duration / every + 1e-9) + 1)]
    if duration - times[-1] > 1e-6:
        times.append(duration)
    return times


class ExportStopped(Exception):
    """The app was quit (SIGTERM) before the last frame; code: its exit status."""

    def __init__(self, code: int) -> None:
        super().__init__(f"stopped with exit status {code}")
        self.code = code


class Progress:
    """One line on stderr: redrawn in place on a terminal, every PROGRESS_LOG_S seconds in a log."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total = label, total
        self.tty = sys.stderr.isatty()
        self._last = time.monotonic()
        self._start = self._last

    def update(self, done: int, t: float, duration: float) -> None:
        now = time.monotonic()
        if done < self.total and now - self._last < (PROGRESS_TTY_S if self.tty else PROGRESS_LOG_S):
            return
        self._last = now
        line = (f"batchtop: exporting {self.label}: frame {done}/{self.total} · {t:.1f}/{duration:.1f}s "
                f"of the recording · {now - self._start:.0f}s so far")
        sys.stderr.write(f"\r\x1b[K{line}" if self.tty else f"{line}\n")
        if self.tty and done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def capture(source: SteppedReplay, plan: ExportPlan, theme: str, add: Callable[[float, Grid], None],
            progress: Progress | None = None) -> None:
    """Draw every frame of the recording into add(t, grid), t in the exported file's seconds; ExportStopped
    when the app was quit first."""
    app = BatchtopApp(source, theme=theme, poll_hz=1.0)  # the exporter paints; the app's timer barely runs
    times = frame_times(source.duration, plan.fps, plan.speed)
    failure: list[Exception] = []
    drawn = [0]

    async def drive(pilot: Pilot) -> None:
        try:
            for k, t in enumerate(times):
                if app.return_code is not None:  # quit (SIGTERM): stop drawing
                    return
                source.advance_to(t)
                app.poll(force=True)
                await pilot.pause()
                add(t / plan.speed, screen_grid(app))
                drawn[0] = k + 1
                if progress is not None:
                    progress.update(k + 1, t, source.duration)
        except Exception as exc:  # the app would swallow it: re-raised below, after the app is gone
            failure.append(exc)
        app.exit(0)

    code = app.run(headless=True, size=(plan.columns, plan.rows), auto_pilot=drive)
    if failure:
        raise failure[0]
    if drawn[0] < len(times):  # SIGTERM quit the app mid-way: no half an export is written
        raise ExportStopped(code or 1)


def export_recording(source: SteppedReplay, plan: ExportPlan, theme: str) -> tuple[str, int]:
    """The whole export document and its number of frames that changed the picture."""
    trace = source.trace
    title = f"batchtop replay {os.path.basename(trace.path)}"
    if plan.format == "asciicast":
        writer: CastWriter | SvgWriter = CastWriter(plan.columns, plan.rows, title,
                                                    unix_time(trace.header.get("start_time")))
    else:
        writer = SvgWriter(plan.columns, plan.rows, title)
    progress = Progress(os.path.basename(plan.path), len(frame_times(source.duration, plan.fps, plan.speed)))
    capture(source, plan, theme, writer.add, progress)
    return writer.text(source.duration / plan.speed), writer.num_frames
