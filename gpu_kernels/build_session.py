"""A build's processes, ended as one: the kernel build runs in a session of its own, and everything
it starts stays in that session (ninja moves each compile into a process group of its own, so a
group kill misses the compilers, and a killed ninja leaves them running). Linux lists a session's
members in /proc; elsewhere the session leader's process group is what can be named."""

from __future__ import annotations

import os
import signal
import threading
import time

PARENT_POLL_S = 0.1
STOP_GRACE_S = 1.0  # SIGTERM first (the compiler driver removes its temporary files), then SIGKILL


def session_members(sid: int) -> list[int] | None:
    """The live processes of session `sid`; None where there is no /proc to read them from."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    members = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] != b"Z" and int(fields[3]) == sid:  # state, ppid, pgrp, session
            members.append(int(entry))
    return members


def end_session(sid: int, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every process of session `sid` but this one, then SIGKILL what is left after grace_s;
    a process started meanwhile (ninja's next compile) is found on the next pass."""
    me = os.getpid()
    deadline = time.monotonic() + grace_s
    sig = signal.SIGTERM
    while True:
        members = session_members(sid)
        if members is None:  # no /proc: the session leader's process group is all that can be named
            try:
                os.killpg(sid, signal.SIGKILL)
            except OSError:
                pass
            return
        members = [pid for pid in members if pid != me]
        if not members:
            return
        for pid in members:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        time.sleep(0.02)


def end_with_parent(parent: int) -> None:
    """(The child) when `parent` is gone, end this build's session, this process last."""
    if not hasattr(os, "getsid"):  # no sessions (Windows): the build runs to its end or its timeout
        return
    if os.getsid(0) != os.getpid():  # not started as a session of its own: its session is not the build's
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        end_session(os.getsid(0))
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
