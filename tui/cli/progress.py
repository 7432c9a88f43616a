"""The progress line of a headless run on stderr: requests done of the total, with an ETA.

On a terminal it is redrawn in place (at most every min_interval_s); elsewhere (a log file, a pipe) a
line is written every log_interval_s. Every count on it only grows (requests done, steps), and the
last line, drawn when the run closes, shows where it ended: the total, for a run that completed.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import TextIO

from batchtop.core_engine.perf.metrics import RateWindow
from batchtop.core_engine.engine.snapshot import StepSnapshot

ETA_WINDOW_S = 30.0  # completions over the last this many seconds set the ETA's rate
MIN_FOR_ETA = 3  # requests done before an ETA is given


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class StderrProgress:
    def __init__(self, total: int, label: str = "", stream: TextIO | None = None, min_interval_s: float = 0.1,
                 log_interval_s: float = 15.0) -> None:
        self.total = max(total, 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.interval_s = min_interval_s if self.tty else log_interval_s
        self._last_draw = time.monotonic()
        self._rate = RateWindow()
        self._generated = 0
        self._done: deque[tuple[float, int]] = deque()  # (run time, requests done)
        self._last: StepSnapshot | None = None
        self._most_done = 0
        self._most_steps = 0

    def update(self, snap: StepSnapshot) -> None:
        c = snap.counters
        if c.generated_tokens >= self._generated:
            self._rate.add(snap.t, c.generated_tokens - self._generated)
        self._generated = c.generated_tokens
        self._most_done = max(self._most_done, c.completed + c.rejected)
        self._most_steps = max(self._most_steps, c.steps)
        self._done.append((snap.t, self._most_done))
        while len(self._done) > MIN_FOR_ETA and snap.t - self._done[1][0] > ETA_WINDOW_S:
            self._done.popleft()
        self._last = snap
        now = time.monotonic()
        if now - self._last_draw >= self.interval_s:
            self._last_draw = now
            self._draw()

    def eta_s(self) -> float | None:
        """Seconds until the last request is done, at the recent completion rate; None until measured."""
        if self._most_done < MIN_FOR_ETA or len(self._done) < 2:
            return None
        (t0, d0), (t1, d1) = self._done[0], self._done[-1]
        if d1 <= d0 or t1 <= t0:
            return None
        return (self.total - self._most_done) / ((d1 - d0) / (t1 - t0))

    def line(self) -> str:
        done, width = min(self._most_done, self.total), 24
        filled = int(width * done / self.total)
        bar = "#" * filled + "-" * (width - filled)
        snap = self._last
        elapsed = snap.t if snap is not None else 0.0
        if done >= self.total:
            eta = f"done in {duration(elapsed)}"
        else:
            left = self.eta_s()
            eta = f"ETA {duration(left)}" if left is not None else "ETA after the first completions"
        waiting = snap.num_waiting if snap is not None else 0
        so_far = "" if done >= self.total else f" · {duration(elapsed)} so far"
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
