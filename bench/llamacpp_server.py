"""llama.cpp's server for the benches: find the binary (or build it from the llama-cpp-python sdist, which
vendors llama.cpp's source tree: ../shared/design/peers.md) and the command lines both servers start with.

Every server process starts in its own session and asks the kernel to kill it when this process dies
(PR_SET_PDEATHSIG), so no server outlives the bench however it ends: an exception, Ctrl-C, SIGTERM or
SIGKILL.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

SDIST = "llama-cpp-python==0.3.36"
SOURCE = "llama_cpp_python-0.3.36"
DEFAULT_SERVER = Path(f"/work/llamacpp/{SOURCE}/vendor/llama.cpp/build/bin/llama-server")
CMAKE_FLAGS = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
               "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON"]
PR_SET_PDEATHSIG = 1


class BenchError(Exception):
    """Bad input or a missing tool: main() prints it and exits 2."""


def die_with_parent() -> None:
    """preexec_fn of every server: SIGKILL when the bench's process dies, however it dies."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def start(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=die_with_parent)


def llama_server_command(binary: Path, gguf: Path, port: int, slots: int, threads: int,
                         extra: Sequence[str] = ()) -> list[str]:
    """-np slots continuous-batching slots sharing -c slots*1024 tokens of context: 1024 each; extra: more
    of llama-server's options."""
    return [str(binary), "-m", str(gguf), "-np", str(slots), "-c", str(slots * 1024), "-t", str(threads),
            "-tb", str(threads), "--host", "127.0.0.1", "--port", str(port), "--metrics", "--slots", *extra]


def batchtop_server_command(gguf: Path, port: int, slots: int, weights: str | None, dtype: str = "auto") -> list[str]:
    """batchtop serve on the same file with the same slots and as many KV tokens as llama.cpp's context."""
    command = [sys.executable, "-m", "batchtop.tui", "serve", "--headless", "--model", str(gguf), "--port", str(port),
               "--max-num-seqs", str(slots), "--num-kv-blocks", str(slots * 1024 // 16), "--block-size", "16",
               "--dtype", dtype]
    return command + (["--weights", weights] if weights else [])


def batchtop_has_weights_option() -> bool:
    """Whether this batchtop's serve takes --weights (issue 43's quantized path)."""
    help_text = subprocess.run([sys.executable, "-m", "batchtop.tui", "serve", "--help"], capture_output=True,
                               text=True).stdout
    return "--weights" in help_text


def find_llama_server(given: Path | None, build_dir: Path | None) -> Path:
    """The binary given, else the default build, else one built into build_dir; BenchError naming what
    is missing."""
    if given is not None:
        if not given.is_file() or not os.access(given, os.X_OK):
            raise BenchError(f"--llama-server: {given} is not an executable file")
        return given
    if DEFAULT_SERVER.is_file():
        return DEFAULT_SERVER
    if build_dir is None:
        raise BenchError(f"--llama-server: no llama-server at {DEFAULT_SERVER}; pass --llama-server PATH, or "
                         "--build-dir DIR to build it there from the llama-cpp-python sdist (~15 min on 2 cores)")
    return build_llama_server(build_dir)


def step(message: str, command: list[str], cwd: Path, env: dict[str, str] | None = None,
         progress_every: int = 0) -> None:
    """One build step, its progress on stdout; its output's tail in the BenchError when it fails."""
    print(f"[llama.cpp build] {message}", flush=True)
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    for line in proc.stdout:
        lines = (lines + [line.rstrip()])[-30:]
        if progress_every and line.startswith("[") and "/" in line.split("]")[0]:
            done, total = (int(x) for x in line[1:line.index("]")].split("/"))
            if done % progress_every == 0 or done == total:
                print(f"[llama.cpp build]   {done}/{total} objects", flush=True)
    if proc.wait():
        raise BenchError(f"building llama-server: {message} failed (exit {proc.returncode}):\n" + "\n".join(lines))


def build_llama_server(build_dir: Path) -> Path:
    """peers.md's recipe: a venv with cmake and ninja, the sdist, llama-server alone (-j2)."""
    build_dir = build_dir.resolve()
    source = build_dir / SOURCE / "vendor" / "llama.cpp"
    binary = source / "build" / "bin" / "llama-server"
    if binary.is_file():
        return binary
    build_dir.mkdir(parents=True, exist_ok=True)
    venv = build_dir / "build-venv"
    if not (venv / "bin" / "cmake").exists():
        step("a virtual environment with cmake, ninja", [sys.executable, "-m", "venv", str(venv)], build_dir)
        step("installing scikit-build-core cmake ninja", [str(venv / "bin" / "pip"), "install", "-q",
                                                          "scikit-build-core", "cmake", "ninja"], build_dir)
    if not source.is_dir():
        step(f"downloading the {SDIST} sdist", [str(venv / "bin" / "pip"), "download", "-q", "--no-deps",
                                                "--no-build-isolation", "--no-binary=:all:", SDIST, "-d", "."],
             build_dir)
        step("unpacking", ["tar", "xzf", f"{SOURCE}.tar.gz"], build_dir)
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
    step("configuring (cmake)", ["cmake", "-B", "build", *CMAKE_FLAGS], source, env)
    step("compiling llama-server (about 15 minutes on 2 idle cores)",
         ["cmake", "--build", "build", "--target", "llama-server", "-j2"], source, env, progress_every=20)
    print(f"[llama.cpp build] done: {binary}", flush=True)
    return binary
