"""Calling code that might loop without end, without hanging the suite."""

from __future__ import annotations

import threading


def returns_within(seconds: float, fn):
    """fn()'s result, or a failure when it has not returned in time (the thread is left spinning, but
    the test says so instead of hanging)."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert out, f"did not return within {seconds} s"
    return out[0]
