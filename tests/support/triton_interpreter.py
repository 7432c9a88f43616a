"""Triton's interpreter for the CPU tests of the Triton kernels, on any Triton a fresh install resolves.

Triton decides at import time whether its own library functions (tl.max, tl.sum's helpers...) are
built for the compiler or for the interpreter: `triton.jit` reads TRITON_INTERPRET when it decorates
them. The suite therefore imports Triton once with the variable set, before anything else does, on a
machine without CUDA, then clears it, so the engine's CPU paths stay off Triton unless a test asks.
A test that wants the kernel interpreted sets TRITON_INTERPRET=1 again (the `interpret` fixture).
"""

from __future__ import annotations

import importlib.metadata
import os

import pytest
import torch


def _version(package: str) -> tuple[int, ...]:
    try:
        text = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ()
    return tuple(int(part) for part in text.split("+")[0].split(".")[:2] if part.isdigit())


def import_for_the_interpreter() -> None:
    """Import Triton with TRITON_INTERPRET=1, so its library functions run under the interpreter."""
    if torch.cuda.is_available() or "TRITON_INTERPRET" in os.environ or not _version("triton"):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # a broken Triton: triton_decode.available() reports it, the tests skip
        pass
    finally:
        del os.environ["TRITON_INTERPRET"]


def why_not_interpretable() -> str | None:
    """Why the Triton kernels cannot run under the interpreter in this process, or None."""
    if not _version("triton"):
        return "triton is not installed"
    if torch.cuda.is_available():
        return ("CUDA is present, so Triton was imported for the compiler; the compiled kernels are tested "
                "in tests/kernels/test_gpu.py and the interpreter tests run on machines without CUDA")
    if _version("triton") < (3, 7) and _version("numpy") >= (2, 4):
        return (f"Triton {'.'.join(map(str, _version('triton')))}'s interpreter breaks on numpy "
                f"{'.'.join(map(str, _version('numpy')))} (numpy >= 2.4 refuses its 1-element array to "
                "scalar conversions; fixed in Triton 3.7)")
    return None


@pytest.fixture
def interpret(monkeypatch):
    """TRITON_INTERPRET=1 for this test: the engine's decode rows and direct kernel calls run the
    Triton kernels under the interpreter."""
    reason = why_not_interpretable()
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
