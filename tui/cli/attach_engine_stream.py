"""`batchtop attach URL` to a batchtop server: its engine's own step stream, when it offers one, in place of
the /metrics panels (--metrics-only keeps those). Imports no Textual."""

from __future__ import annotations

from batchtop.core_engine.attach.engine_stream import EngineStream, StreamBroken, StreamRefused
from batchtop.core_engine.attach.setup import AttachSetup
from batchtop.tui.cli.headless import note


def wants_engine_stream(setup: AttachSetup) -> bool:
    """One URL on screen, with nothing only /metrics scrapes can do (recording them, a workload from
    them, a server's side streams)."""
    opts = setup.opts
    return (len(setup.urls) == 1 and not opts.headless and not opts.metrics_only and opts.record is None
            and opts.export_workload is None and not opts.streams)


def open_engine_stream(setup: AttachSetup) -> EngineStream | None:
    """The server's step stream, open with its header read; None (and why, when it matters) for a
    server without one: a vLLM, an older batchtop, a batchtop whose key we lack, no server at all."""
    if not wants_engine_stream(setup):
        return None
    stream = EngineStream(setup.urls[0], api_key=setup.opts.api_key)
    try:
        stream.open()
    except StreamRefused as exc:
        stream.close()
        if exc.status != 404:
            note(f"{exc}; showing its /metrics panels")
        return None
    except StreamBroken:  # no server there (yet): the /metrics panels say so, replica by replica
        stream.close()
        return None
    return stream
