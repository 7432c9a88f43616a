"""Reading Linux's /proc files; None where there is none (another OS, a locked-down container)."""

from __future__ import annotations


def kib_field(path: str, key: str) -> int | None:
    """The bytes of a `Key:   N kB` line in /proc/meminfo or /proc/self/status."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
