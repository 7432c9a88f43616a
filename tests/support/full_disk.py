"""A disk that fills up under a trace: the trace writer's files take `capacity` bytes, then every write
fails with ENOSPC as a full tmpfs's do (partial writes up to the edge, like the kernel's); and a real
small tmpfs where this process may mount one (root), skipped with the reason where it may not.

`python -c "from tests.support.full_disk import main; main()" CAPACITY ARGS...` runs the batchtop CLI
in a process of its own with the writer patched (a serve test's server)."""

from __future__ import annotations

import errno
import io
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from batchtop.core_engine.trace import writer

ROOT = Path(__file__).resolve().parents[2]


class FillingFile(io.RawIOBase):
    """A real file that takes `capacity` bytes in all, then raises ENOSPC."""

    def __init__(self, path: str, capacity: int) -> None:
        self._file = open(path, "wb", buffering=0)
        self.left = capacity

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._file.fileno()

    def write(self, data) -> int:
        if self.left <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = min(len(data), self.left)
        self._file.write(bytes(data[:n]))
        self.left -= n
        return n

    def close(self) -> None:
        self._file.close()
        super().close()


def filling_open(capacity: int):
    """An `open` for the trace writer's module: every trace it opens fills after `capacity` bytes."""
    def open_filling(path, mode: str = "r", *args, **kwargs):
        assert mode == "wb", mode
        return io.BufferedWriter(FillingFile(path, capacity))
    return open_filling


def fill_traces_after(monkeypatch: pytest.MonkeyPatch, capacity: int) -> None:
    monkeypatch.setattr(writer, "open", filling_open(capacity), raising=False)


def filling_command(capacity: int, *args: str) -> list[str]:
    """The argv of a batchtop process whose traces fill after `capacity` bytes."""
    code = "from tests.support.full_disk import main; main()"
    return [sys.executable, "-c", code, str(capacity), *args]


def filling_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else ""),
            "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def main() -> None:
    """`batchtop ARGS...` with every trace filling after argv[1] bytes."""
    capacity = int(sys.argv[1])
    writer.open = filling_open(capacity)  # a module global: it shadows the builtin for the writer only
    sys.argv = ["batchtop", *sys.argv[2:]]
    from batchtop.tui.__main__ import main as batchtop
    batchtop()


@contextmanager
def small_tmpfs(path: Path, size: str = "128k") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` for the test, unmounted after; skips saying why when this
    process may not mount one (not root, no mount(8), a container without CAP_SYS_ADMIN)."""
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) here: the full tmpfs case needs one (the simulated full disk still runs)")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}): the full tmpfs "
                    "case needs root and mount; the simulated full disk still runs")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
