"""The CPU kernels' build machinery: a directory per sources-and-versions key, a lock that a killed
build cannot leave behind, a bounded wait for a live builder, and the switch between two steps; and
sources that compile for a CPU without AVX-512 as well as for this one."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time

import pytest
import torch
from torch.utils import cpp_extension

from batchtop.core_engine.device import cpu_flags
from batchtop.core_engine.engine.engine import Engine
from batchtop.gpu_kernels import cpu_kernel_build as build
from batchtop.gpu_kernels.build_session import end_session
from batchtop.gpu_kernels import cpu_kernels
from tests.conftest import make_requests, tiny_config


def test_two_checkouts_or_versions_never_share_a_build_directory(tmp_path, monkeypatch):
    here = build.build_key()
    other = tmp_path / "csrc"
    shutil.copytree(build.CSRC, other)
    monkeypatch.setattr(build, "CSRC", other)
    assert build.build_key() == here  # the same sources elsewhere: the same library, built once
    (other / "fused_ops_cpu.cpp").write_text((other / "fused_ops_cpu.cpp").read_text() + "\n// changed\n")
    changed = build.build_key()
    assert changed != here
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert build.build_key() not in (here, changed)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    assert build.build_dir(here) != build.build_dir(changed) and build.build_dir(here).parent == tmp_path / "ext"


def fake_load(calls: list):
    """cpp_extension.load as far as the lock is concerned: torch's baton would wait on a `lock` file."""
    def load(name, sources, *, build_directory, **kwargs):
        assert not (build.Path(build_directory) / "lock").exists(), "torch would sleep on this lock forever"
        build.library_path(build.Path(build_directory)).write_bytes(b"\x7fELF")
        calls.append(name)
    return load


def test_a_lock_left_by_a_killed_build_is_removed_not_waited_on(tmp_path, monkeypatch, capsys):
    from torch.utils import cpp_extension
    calls: list = []
    monkeypatch.setattr(cpp_extension, "load", fake_load(calls))
    directory = tmp_path / "kernels"
    directory.mkdir()
    (directory / "lock").write_text("")  # what torch's FileBaton leaves when its build is killed
    started = time.monotonic()
    assert build.build_here(directory, wait_s=1.0) == 0
    assert time.monotonic() - started < 1.0 and calls == [build.NAME] and build.is_built(directory)
    assert "removed a stale lock left by a killed build" in capsys.readouterr().err
    assert build.build_here(directory) == 0 and calls == [build.NAME]  # built: nothing to do


def test_a_live_builder_is_waited_for_a_bounded_time_then_the_torch_ops_run(tmp_path):
    directory = tmp_path / "kernels"
    directory.mkdir()
    with open(directory / "batchtop.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another batchtop, building (or stopped mid-build)
        started = time.monotonic()
        assert build.build_here(directory, wait_s=0.3) == build.EXIT_LOCK_TIMEOUT
        assert time.monotonic() - started < 5
        state = build.ChildBuild(directory, lock_wait_s=0.3).start().wait(timeout=120)
    assert state.phase == "failed" and "held the build lock" in state.why and str(directory) in state.why
    assert "could not be built" in state.describe()


def test_a_build_that_fails_says_why_and_leaves_nothing_that_looks_built(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))  # the child inherits it
    directory = tmp_path / "kernels"
    seen: list[str] = []
    state = build.ChildBuild(directory, on_change=lambda s: seen.append(s.phase)).start().wait(timeout=120)
    assert state.phase == "failed" and state.why.startswith("exit 1:") and "Error" in state.why
    assert seen[-1] == "failed" and not build.is_built(directory)


def test_kernels_built_in_the_background_come_in_between_two_steps(monkeypatch):
    """The engine steps on the torch ops until the build is done; the next step runs the kernels, and the
    snapshot (and so the trace) says from which step."""
    ready = iter([False, False, True])
    monkeypatch.setattr(cpu_kernels, "switch_in", lambda: next(ready, False))
    engine = Engine(tiny_config())
    engine.load_workload(make_requests(3, seed=1, output=(5, 5)))
    controls = [engine.step().controls for _ in range(4)]
    assert controls == [(), (), (("cpu_kernels", "in"),), ()]


def test_why_unavailable_says_a_background_build_is_running(monkeypatch):
    state = build.BuildState("building", 2, 5, started=time.monotonic() - 12)
    monkeypatch.setattr(cpu_kernels, "_active", False)
    monkeypatch.setattr(cpu_kernels, "_background", type("B", (), {"state": state})())
    assert cpu_kernels.available() is False  # never blocks while the build runs
    assert cpu_kernels.why_unavailable() == ("building (2/5 done, 12 s) in the background; "
                                             "the torch ops run meanwhile")


@pytest.fixture(autouse=True)
def _no_background_build_left():
    yield
    cpu_kernels.stop_background()


def test_the_build_ahead_command_finds_a_built_library_and_says_where(tmp_path, monkeypatch):
    """README: `python -m batchtop.gpu_kernels.build_cpu_kernels` right after installing; here on a
    directory already marked built, so nothing compiles."""
    import subprocess
    import sys

    from batchtop.gpu_kernels.cpu_kernel_build import MARKER, library_path
    directory = tmp_path / "kernels"
    directory.mkdir()
    library_path(directory).write_bytes(b"")
    (directory / MARKER).write_text("x\n")
    done = subprocess.run([sys.executable, "-m", "batchtop.gpu_kernels.build_cpu_kernels", str(directory)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == str(library_path(directory))
    assert "RuntimeWarning" not in done.stderr


@pytest.mark.skipif(shutil.which("c++") is None or not sysconfig.get_platform().endswith("x86_64"),
                    reason="no C++ compiler, or not x86-64")
def test_every_kernel_source_compiles_for_the_cpus_this_one_is_not():
    """The build is -march=native: on another CPU other vector paths compile in, and they must compile,
    or the kernels fail to build there and every kernel test skips silently. Checked with -fsyntax-only,
    every source with a vector path at once, for x86-64-v2 (no AVX at all: the portable paths) and,
    where this CPU has AVX-512 (so that its own build leaves them out), for x86-64-v3 (AVX2 and FMA:
    the 8-lane paths)."""
    marches = ["x86-64-v2"] + (["x86-64-v3"] if "avx512f" in cpu_flags() else [])
    includes = [f"-I{path}" for path in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    # every source but register_ops_cpu.cpp (the schemas): each has a vector path, or includes a header that has
    vectorised = [source for source in build.SOURCES if source.name != "register_ops_cpu.cpp"]
    assert len(vectorised) == len(build.SOURCES) - 1
    failed = {}
    for march in marches:  # a march at a time: each compiler takes most of a GiB
        procs = {source.name: subprocess.Popen(
                     ["c++", "-std=c++20", "-fsyntax-only", "-fopenmp", f"-march={march}", *includes, str(source)],
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for source in vectorised}
        errors = {name: proc.communicate(timeout=300)[1] for name, proc in procs.items()}
        failed |= {(march, name): errors[name][:2000] for name, proc in procs.items() if proc.returncode != 0}
    assert not failed, failed


# -- issue 41, finding 13: a build ends with its parent ----------------------------------------------------

FAKE_COMPILER = """#!/bin/sh
# a compiler whose every compile takes a minute: the real one answers torch's version checks
for arg in "$@"; do
  if [ "$arg" = "-c" ]; then echo $$ >> "{pids}"; exec sleep 60; fi
done
exec c++ "$@"
"""

PARENT = """
import sys, time
from pathlib import Path
from batchtop.gpu_kernels.cpu_kernel_build import ChildBuild
build = ChildBuild(Path(sys.argv[1])).start()
while build._proc is None:
    time.sleep(0.01)
print(build._proc.pid, flush=True)
build.wait()
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def kill_all(pids) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not os.path.isdir("/proc") or shutil.which("c++") is None, reason="needs /proc and a compiler")
def test_a_build_whose_parent_is_killed_stops_with_every_compile_and_frees_its_lock(tmp_path):
    """The report's case: SIGTERM to batchtop mid-build left python, ninja and the compilers running,
    reparented to PID 1, and the next run waited behind their lock. Here the parent dies of SIGTERM
    without a handler (no cleanup of its own can run) while ninja runs compiles that take a minute."""
    pids = tmp_path / "compiles"
    compiler = tmp_path / "slow-g++"  # the name tells torch it is a g++
    compiler.write_text(FAKE_COMPILER.format(pids=pids))
    compiler.chmod(0o755)
    directory = tmp_path / "kernels"
    env = {**os.environ, "CXX": str(compiler), "MAX_JOBS": "2", "OMP_NUM_THREADS": "1"}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(directory)], stdout=subprocess.PIPE, text=True,
                              env=env)
    child = int(parent.stdout.readline())
    started: list[int] = []
    try:
        assert wait_until(lambda: pids.exists() and pids.read_text().count("\n") >= 1, 90), "no compile started"
        parent.send_signal(signal.SIGTERM)
        parent.wait(timeout=10)
        started = [int(p) for p in pids.read_text().split()]
        assert wait_until(lambda: not any(alive(p) for p in [child, *started]), 5), \
            f"still running: {[p for p in [child, *started] if alive(p)]}"
        with open(directory / "batchtop.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the next run builds at once, waits for nobody
    finally:
        parent.kill()
        kill_all([child, *started])


def test_stopping_a_build_ends_processes_in_process_groups_of_their_own(tmp_path):
    """ninja runs each compile in a process group of its own: a group kill (or a killed ninja) left
    them running. Stopping ends the build's whole session."""
    script = ("import subprocess, sys, time\n"
              "grandchild = subprocess.Popen(['sleep', '60'], process_group=0)\n"
              "print(grandchild.pid, flush=True)\n"
              "time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    grandchild = int(child.stdout.readline())
    try:
        assert os.getpgid(grandchild) != os.getpgid(child.pid)
        started = time.monotonic()
        end_session(child.pid)
        child.wait(timeout=5)
        assert wait_until(lambda: not alive(grandchild), 2) and time.monotonic() - started < 3
    finally:
        kill_all([child.pid, grandchild])
