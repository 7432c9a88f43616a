"""The wall clock the status line reads at paint time: how long a step has been in flight, how long the
model has been loading, how long since batchtop started. One place, so that a test can move it.

Read it as `wall.now()` (not `from ... import now`): a test replaces the module's `now`.
"""

from __future__ import annotations

import os
import time


def now() -> float:
    return time.monotonic()


def _process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc), so the counter includes the imports and the
    set-up before the first frame; None where /proc cannot tell."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return None


LAUNCHED = now() - (_process_age_s() or 0.0)  # when batchtop started, on now()'s clock


def since_launch() -> float:
    return now() - LAUNCHED


def clock_text(seconds: float) -> str:
    """1:05, 12:40, 1:02:03: an elapsed time that reads as a clock."""
    whole = max(0, int(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
