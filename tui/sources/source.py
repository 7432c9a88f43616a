"""What the one App shows: a frame source. The live engine, a what-if engine, a served engine, a replay,
a live attach and an attach replay are each a source, not an App subclass.

A source runs on the app's worker thread and publishes its newest frame by swapping one reference;
the app polls it, hands it to the panel set its `layout` names, and turns keys into `act(control)`.
Nothing here imports Textual.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from batchtop.core_engine.config import EngineConfig
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.perf.telemetry import TelemetrySampler
from batchtop.core_engine.simulate.simulation import Simulation

Notify = Callable[[str, str], None]  # (kind, text): kind is "error", "finished", "quit" or "info"

ENGINE_LAYOUT = "engine"  # slots, KV blocks, waiting, roofline, device, metrics
ATTACH_LAYOUT = "attach"  # replicas, then the same questions answered from a server's /metrics


class FrameSource(Protocol):
    layout: str
    controls: frozenset[str]  # the key actions this source accepts (the app hides the others)
    frame: object  # the newest frame: DashboardFrame (engine layout) or AttachFrame (attach layout)
    done: threading.Event  # set once the source's thread has left
    notify: Notify  # the app sets it: rare events (a crash, the end of the work) reach the screen

    def run(self, is_cancelled: Callable[[], bool]) -> None:
        """The worker thread's body: produce frames until stopped or cancelled."""

    def stop(self) -> None: ...

    def act(self, control: str) -> str | None:
        """Apply a key's action (one of `controls`); returns what to tell the user, if anything."""

    def status(self, frame: object) -> str:
        """The source's own part of the status line: a replay's position, a caption, the server's URL."""


@dataclass(frozen=True)
class EngineInfo:
    """What the engine panels say about the engine behind a source."""

    config: EngineConfig
    peaks: DevicePeaks | None
    device_label: str
    live: bool = True  # False: a replay, with no engine or telemetry behind it
    simulation: Simulation | None = None  # a what-if run: its modelled panels say so
    workload: dict | None = None  # the workload's metrics/trace record (how its arrivals are paced)
    telemetry: TelemetrySampler | None = None
    no_telemetry: str | None = None  # the Device panel's words where none comes (None: a recording's)
