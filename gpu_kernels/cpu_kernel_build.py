"""Building batchtop's C++ CPU kernels (csrc/) with torch's cpp_extension, in a child process, so that a
build never blocks, hangs or crashes the process that wants the kernels.

- The build directory is keyed by everything the library depends on (the sources' bytes, the compiler
  flags, torch's and Python's versions, the CPU): two checkouts, or two versions of batchtop, never
  build into one directory and never rebuild each other's library in turn.
- Builders of one directory take an advisory lock (fcntl.flock on `batchtop.lock`), released by the
  kernel when a builder dies, so a killed build leaves nothing to wait on. Holding it, a builder removes
  torch's own `lock` file if one is left there (a killed build leaves it behind, and torch would sleep
  on it forever), then builds. Waiting for another live builder is bounded (LOCK_WAIT_S), and so is
  the build itself (BUILD_TIMEOUT_S): past either, the torch ops run and the reason is given.
- The child prints ninja's `[k/n]` lines, which the parent reads as progress.
- The build ends with its parent. The child starts a session of its own, and everything the build
  runs stays in it (ninja puts each compile in a process group of its own, so a group kill would miss
  the compilers, and a SIGKILLed ninja leaves them running). Stopping a build ends the whole session;
  and the child watches its parent, so when the parent is gone however it went (SIGTERM, SIGINT,
  os._exit, SIGKILL) the child ends its session at once: no compiler runs on, reparented to PID 1,
  holding the lock the next run would wait behind.
- A finished build leaves `built.ok` beside the library: its presence is what "built" means.

Run as a module it builds (or finds) the library and prints where: `python -m batchtop.gpu_kernels.cpu_kernel_build`.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from batchtop.gpu_kernels.build_session import end_session, end_with_parent

CSRC = Path(__file__).with_name("csrc")
# the longest compiles first: ninja starts them in this order, so no long one is left to run alone at the end
SOURCES = [CSRC / name for name in ("register_ops_cpu.cpp", "paged_attention_cpu.cpp", "decoder_layer_cpu.cpp",
                                    "fused_ops_cpu.cpp", "linear_bf16_cpu.cpp", "linear_quant_cpu.cpp",
                                    "quant_repack.cpp", "sampling_cpu.cpp", "decoder_stack_cpu.cpp",
                                    "decoder_team_cpu.cpp")]
NAME = "batchtop_cpu_kernels"
CFLAGS = ["-O3", "-march=native", "-fopenmp"]
LDFLAGS = ["-fopenmp"]
LOCK_WAIT_S = 300.0  # the longest a builder waits for another live builder of the same directory
BUILD_TIMEOUT_S = 900.0  # a compile that takes longer is stuck: stop it and run the torch ops
MARKER = "built.ok"
EXIT_LOCK_TIMEOUT = 3
PARENT_ENV = "BATCHTOP_BUILD_PARENT"  # the pid the child builds for; it stops when that process is gone
PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]")


def build_key() -> str:
    """A digest of everything the built library depends on."""
    h = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        if path.suffix in (".cpp", ".h", ".hpp"):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    import torch  # only here: reading the module's constants must not cost torch's import
    h.update(repr((CFLAGS, LDFLAGS, torch.__version__, sys.version_info[:2], platform.machine(),
                   _cpu_identity())).encode())
    return h.hexdigest()[:16]


def _cpu_identity() -> str:
    """-march=native builds for this CPU: a home directory shared between machines keys by CPU too."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor()
    lines = [line for line in text.splitlines() if line.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(lines))  # the same on every core: once each


def extensions_root() -> Path:
    """torch's extensions directory (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions/py311_cpu)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root:
        return Path(root)
    from torch.utils import cpp_extension
    version = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return Path(cpp_extension.get_default_build_root()) / f"{version}_cpu"


def build_dir(key: str | None = None) -> Path:
    return extensions_root() / f"{NAME}-{key or build_key()}"


def library_path(directory: Path) -> Path:
    return directory / f"{NAME}.so"


def is_built(directory: Path) -> bool:
    return (directory / MARKER).is_file() and library_path(directory).is_file()


# -- the child: one build, under the directory's lock --------------------------------------------------
def _locked(directory: Path, wait_s: float):
    """The directory's build lock, or None after wait_s seconds of another builder holding it."""
    directory.mkdir(parents=True, exist_ok=True)
    handle = open(directory / "batchtop.lock", "a+")
    try:
        import fcntl
    except ImportError:  # no flock (Windows): a torch lock older than the longest build is stale
        lock = directory / "lock"
        if lock.exists() and time.time() - lock.stat().st_mtime > BUILD_TIMEOUT_S:
            lock.unlink(missing_ok=True)
        return handle
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if time.monotonic() > deadline:
                handle.close()
                return None
            time.sleep(0.2)


def build_here(directory: Path, wait_s: float = LOCK_WAIT_S) -> int:
    """Build the library into `directory` in this process (the child's body); the exit status."""
    handle = _locked(directory, wait_s)
    if handle is None:
        print(f"another process has held the build lock in {directory} for {wait_s:.0f} s", file=sys.stderr)
        return EXIT_LOCK_TIMEOUT
    with handle:
        if is_built(directory):
            return 0
        stale = directory / "lock"
        if stale.exists():  # we hold the builders' lock: torch's lock is a killed build's leftover
            print(f"removed a stale lock left by a killed build: {stale}", file=sys.stderr)
            stale.unlink(missing_ok=True)
        (directory / MARKER).unlink(missing_ok=True)
        from torch.utils import cpp_extension
        cpp_extension.load(NAME, [str(s) for s in SOURCES], build_directory=str(directory), verbose=True,
                           is_python_module=False, extra_cflags=CFLAGS, extra_ldflags=LDFLAGS)
        (directory / MARKER).write_text(directory.name + "\n", encoding="utf-8")
    return 0


# -- the parent: a build in a child process -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BuildState:
    phase: str  # waiting | building | built | failed
    done: int = 0  # compile and link steps finished, of `total` (ninja's count; 0 until it starts)
    total: int = 0
    why: str | None = None  # failed: what went wrong, in one line
    seconds: float = 0.0  # since the build started, when this state was reached
    started: float = 0.0  # time.monotonic() when the build started

    def describe(self) -> str:
        if self.phase == "failed":
            return f"could not be built ({self.why})"
        if self.phase == "built":
            return f"built in {self.seconds:.0f} s"
        steps = f"{self.done}/{self.total} done" if self.total else f"0/{len(SOURCES) + 1} done"
        return f"building ({steps}, {time.monotonic() - self.started:.0f} s)"


class ChildBuild:
    """One build of `directory` in a child process, watched from a thread."""

    def __init__(self, directory: Path, on_change: Callable[[BuildState], None] | None = None,
                 lock_wait_s: float = LOCK_WAIT_S, timeout_s: float = BUILD_TIMEOUT_S) -> None:
        self.directory = directory
        self.on_change = on_change or (lambda state: None)
        self.lock_wait_s = lock_wait_s
        self.timeout_s = timeout_s
        self._start = time.monotonic()
        self.state = BuildState("waiting", started=self._start)
        self.finished = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._run, name="cpu-kernel-build", daemon=True)

    def start(self) -> ChildBuild:
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> BuildState:
        self.finished.wait(timeout)
        return self.state

    def stop(self) -> None:
        """Stop a build still running (the process is exiting), with everything it started: the lock
        dies with the child."""
        proc = self._proc
        if proc is not None and proc.poll() is None:  # once reaped, its pid (the session's id) may be reused
            end_session(proc.pid)

    def _set(self, phase: str, **fields) -> None:
        fields.setdefault("done", self.state.done)
        fields.setdefault("total", self.state.total)
        self.state = BuildState(phase, seconds=time.monotonic() - self._start, started=self._start, **fields)
        self.on_change(self.state)

    def _run(self) -> None:
        try:
            self._build()
        except Exception as exc:  # a missing compiler, an unstartable child: say so, run the torch ops
            self._set("failed", why=f"{type(exc).__name__}: {exc}")
        finally:
            self.finished.set()

    def _build(self) -> None:
        command = [sys.executable, "-m", "batchtop.gpu_kernels.cpu_kernel_build", str(self.directory),
                   str(self.lock_wait_s)]
        # At normal priority: at nice 10 beside an engine whose threads keep both cores busy, the build
        # got a tenth of a core and was still going after minutes, the engine on the slow ops all along.
        self._proc = proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                             errors="replace", start_new_session=True,
                                             env={**os.environ, PARENT_ENV: str(os.getpid())})
        timer = threading.Timer(self.timeout_s, self.stop)
        timer.daemon = True
        timer.start()
        tail: list[str] = []
        try:
            for line in proc.stdout:
                tail = (tail + [line.rstrip()])[-20:]
                match = PROGRESS.match(line)
                if match:
                    self._set("building", done=int(match[1]), total=int(match[2]))
            code = proc.wait()
            end_session(proc.pid)  # a child that died leaves no compile behind (they keep its id taken)
        finally:
            timer.cancel()
        if code == 0 and is_built(self.directory):
            self._set("built", done=self.state.total, total=self.state.total)
        elif code == EXIT_LOCK_TIMEOUT:
            self._set("failed", why=f"another batchtop held the build lock in {self.directory} for "
                                    f"{self.lock_wait_s:.0f} s")
        elif code < 0 or time.monotonic() - self._start >= self.timeout_s:
            self._set("failed", why=f"the build was stopped after {time.monotonic() - self._start:.0f} s")
        else:
            errors = [t for t in tail if "error" in t.lower()] or tail
            self._set("failed", why=f"exit {code}: {errors[-1] if errors else 'no output'}")


def main(argv: list[str]) -> int:
    """The child: build into argv[0] (default: this checkout's directory), waiting up to argv[1] s."""
    if os.environ.get(PARENT_ENV, "").isdigit():
        end_with_parent(int(os.environ[PARENT_ENV]))
    target = Path(argv[0]) if argv else build_dir()
    code = build_here(target, float(argv[1]) if len(argv) > 1 else LOCK_WAIT_S)
    if code == 0:
        print(library_path(target))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
