"""Where result documents go, and the rules for writing them (docs/headless.md, "Output files").

A new path or an existing regular file is replaced atomically (a reader never sees half a document).
Anything else a user names is written INTO, never replaced: a symlink is followed (its target is the
file), a FIFO, a device, /dev/stdout or a `>(...)` process substitution is opened for writing. Every
check runs before any work starts, so a long run never ends on an unwritable path.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from batchtop.core_engine.errors import ConfigError

STDOUT = "-"


class OutputError(OSError):
    """Writing a result failed after the run (disk full, a reader that went away); names the path."""

    def __init__(self, path: str, cause: OSError) -> None:
        super().__init__(cause.errno, f"cannot write {path}: {cause.strerror or cause}")
        self.path = path

    def __str__(self) -> str:
        return self.strerror


def _target(path: str) -> os.stat_result | None:
    """What the path points at, symlinks followed; None for a new path (or a dangling symlink)."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def check_writable(path: str | None, option: str = "--output") -> None:
    """Fail before the run, not after it, when the output cannot be written where the user asked."""
    if path is None or path == STDOUT:
        return
    if not path:  # os.stat("") reads as a new file in the working directory; open("") fails after the run
        raise ConfigError(option, "the path is empty: name a file"
                                  + (" (or - for stdout)" if option == "--output" else ""))
    try:
        st = _target(path)
    except OSError as exc:
        why = "a symlink loop (it leads back to itself)" if exc.errno == errno.ELOOP else exc.strerror or exc
        raise ConfigError(option, f"{path}: {why}") from None
    if st is None:
        if path.endswith(("/", os.sep)):  # a folder that does not exist: open() would fail after the run
            raise ConfigError(option, f"{path} names a directory (it ends in /) that does not exist: name a file")
        parent = Path(os.path.realpath(path)).parent
        if not parent.is_dir():
            raise ConfigError(option, f"directory {parent} does not exist")
        if not os.access(parent, os.W_OK):
            raise ConfigError(option, f"directory {parent} is not writable")
        return
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(option, f"{path} is a directory")
    # root passes every access() check: the mode bits say what the owner meant
    if not os.access(path, os.W_OK) or (stat.S_ISREG(st.st_mode) and not st.st_mode & 0o222):
        raise ConfigError(option, f"{path} is read-only; it is not replaced (choose another path or chmod it)")


def _identity(path: str) -> tuple | None:
    """What a path writes to, for same-file checks ('-' is whatever stdout is); None for /dev/null."""
    if path == STDOUT:
        try:
            st: os.stat_result | None = os.fstat(sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):  # a captured stdout (tests) has no descriptor
            return ("stdout",)
    else:
        st = _target(path)
    if st is None:
        return ("new", os.path.realpath(path))
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.stat(os.devnull).st_rdev:
        return None
    return (st.st_dev, st.st_ino)


def check_distinct(outputs: Mapping[str, str | None], inputs: Mapping[str, str | None] = {}) -> None:
    """No output may be another output or an input: -o onto --workload would destroy the workload.

    /dev/null may take any number of outputs; stdout ('-', /dev/stdout) may take only one."""
    seen: dict[tuple, str] = {}
    for option, path in [*inputs.items(), *outputs.items()]:
        if path is None or path in ("synthetic", "teaching") and option in inputs:
            continue
        try:
            key = _identity(path)
        except OSError:
            continue  # check_writable names what is wrong with it
        if key is None:
            continue
        if key in seen:
            raise ConfigError(option, f"{path} is the same file as {seen[key]}: refusing to write over it")
        seen[key] = f"{option} {path}"


def check_outputs(outputs: Mapping[str, str | None], inputs: Mapping[str, str | None] = {}) -> None:
    """Every output (option -> path) writable where it points, and none of them another output or an
    input; None means the option was not given."""
    for option, path in outputs.items():
        check_writable(path, option)
    check_distinct(outputs, inputs)


def write_text(text: str, path: str | None) -> None:
    """Write a whole document where the user asked; raises OutputError naming the path on failure."""
    if path is None or path == STDOUT:
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except OSError as exc:
            raise OutputError("stdout", exc) from None
        return
    try:
        st = _target(path)
        if st is not None and not stat.S_ISREG(st.st_mode):
            with open(path, "w", encoding="utf-8") as f:  # a FIFO, a device, a terminal: write into it
                f.write(text)
            return
        _replace_atomically(os.path.realpath(path), text, st)
    except OSError as exc:
        raise OutputError(path, exc) from None


def _replace_atomically(real: str, text: str, st: os.stat_result | None) -> None:
    """A temporary file beside the target, renamed over it; the target keeps its permission bits."""
    parent = os.path.dirname(real)
    if st is not None and not os.access(parent, os.W_OK):
        with open(real, "w", encoding="utf-8") as f:  # a writable file in a read-only folder
            f.write(text)
        return
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(real)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, real)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def json_safe(value: object) -> object:
    """The value with every NaN and +-Infinity inside it (dicts, lists, tuples) turned into None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def json_text(doc: dict) -> str:
    """Strict JSON, whatever the numbers: a NaN or an Infinity that got this far is written as null
    (JSON has no token for them, most parsers refuse Python's), so the final write of a run can
    never fail on one and lose the run."""
    return json.dumps(json_safe(doc), indent=2, sort_keys=False, allow_nan=False) + "\n"


def deliver_json(doc: dict, path: str | None) -> bool:
    """Write a run's result; when that fails (disk full, a closed pipe) the document goes to stderr
    instead, with the error naming the path, so the run is never lost. False: the caller exits 1."""
    text = json_text(doc)
    try:
        write_text(text, path)
        return True
    except OutputError as exc:
        if exc.path == "stdout":  # nobody reads stdout any more: keep Python's exit flush from failing too
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.stderr.write(text)
        sys.stderr.write(f"Error: {exc}; the document is printed above, on stderr\n")
        sys.stderr.flush()
        return False
