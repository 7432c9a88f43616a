"""The progress line of a headless run on stderr: the work done (the bar, in tokens: tui/cli/eta.py),
requests done of the total, and an ETA from the work's pace.

On a terminal it is redrawn in place (at most every min_interval_s); elsewhere (a log file, a pipe) a
line is written every log_interval_s. Every count on it only grows (the bar, requests done, steps), and
the last line, drawn when the run closes, shows where it ended: the total, for a run that completed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TextIO

from batchtop.core_engine.perf.metrics import RateWindow
from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.core_engine.sched.request import Request
from batchtop.tui.cli.eta import RunEta

RATE_WINDOW_S = 10.0  # the tok/s shown: over this many seconds (a 2 s window read 0 between slow steps)


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class StderrProgress:
    def __init__(self, requests: Sequence[Request], label: str = "", stream: TextIO | None = None,
                 min_interval_s: float = 0.1, log_interval_s: float = 15.0) -> None:
        self.total = max(len(requests), 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.interval_s = min_interval_s if self.tty else log_interval_s
        self._last_draw = time.monotonic()
        self._rate = RateWindow(RATE_WINDOW_S)
        self._generated = 0
        self._eta = RunEta(requests)
        self._last: StepSnapshot | None = None
        self._most_work = 0.0  # the largest share of the work done yet: the bar never goes back
        self._most_done = 0
        self._most_steps = 0

    def update(self, snap: StepSnapshot) -> None:
        c = snap.counters
        if c.generated_tokens >= self._generated:
            self._rate.add(snap.t, c.generated_tokens - self._generated)
        self._generated = c.generated_tokens
        self._most_done = max(self._most_done, c.completed + c.rejected)
        self._most_steps = max(self._most_steps, c.steps)
        if snap.is_step:  # an idle look between steps has no slots' progress to read
            self._eta.update(snap)
            self._most_work = max(self._most_work, self._eta.fraction_done())
        self._last = snap
        now = time.monotonic()
        if now - self._last_draw >= self.interval_s:
            self._last_draw = now
            self._draw()

    def eta_s(self) -> float | None:
        """Seconds until the workload's last token, at the smoothed pace of its work; None until measured."""
        return self._eta.eta_s()

    def line(self) -> str:
        done, width = min(self._most_done, self.total), 24
        finished = done >= self.total
        filled = width if finished else min(int(width * self._most_work), width - 1)
        bar = "#" * filled + "-" * (width - filled)
        snap = self._last
        elapsed = snap.t if snap is not None else 0.0
        if finished:
            eta = f"done in {duration(elapsed)}"
        else:
            left = self.eta_s()
            eta = f"ETA {duration(left)}" if left is not None else "ETA after the first steps"
        waiting = snap.num_waiting if snap is not None else 0
        so_far = "" if finished else f" · {duration(elapsed)} so far"
        return (f"{self.label}[{bar}] {done}/{self.total} requests · {eta}{so_far} · "
                f"step {self._most_steps} · {self._rate.rate():.0f} tok/s · waiting {waiting}")

    def _draw(self) -> None:
        self.stream.write(f"\r{self.line()} " if self.tty else f"batchtop: {self.line()}\n")
        self.stream.flush()

    def close(self) -> None:
        """The last line: where the run ended."""
        if self._last is None:
            return
        self._draw()
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
