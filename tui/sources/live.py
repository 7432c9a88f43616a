"""A live engine as a frame source: its Session stepped by the RunLoop on the worker thread, each step
folded into frames; keys become engine commands and loop calls. The same source serves a what-if
engine (paced simulated time, `<` `>`) and a served one (idle, not finished, when out of work).

Nothing here touches a widget: the app polls `frame`, and rare events (an engine crash, the workload
finishing) go through `notify`.
"""

from __future__ import annotations

import math
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace

from batchtop.core_engine.engine import control
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.output_files import OutputError
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.perf.live_roofs import LiveRoofs, RoofsView
from batchtop.core_engine.perf.telemetry import TelemetrySampler
from batchtop.core_engine.run.loop import RunLoop, Stepped
from batchtop.core_engine.run.playback_speed import WallPace
from batchtop.core_engine.run.live_session import Session
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.simulate.simulation import Simulation
from batchtop.tui.sources import wall
from batchtop.core_engine.run.frame import DashboardFrame, FrameBuilder, restarted
from batchtop.tui.sources.in_flight import WatchedSession
from batchtop.tui.sources.pending import Pending, SentControls, pending_over
from batchtop.tui.sources.source import ENGINE_LAYOUT, EngineInfo, Notify

PUBLISH_INTERVAL_S = 0.1  # the UI polls at 10 Hz: a frame more often would be built for nobody
SLOW_STEP_S = 2.0  # a step in flight longer than this is counted on the status line, second by second

LIVE_CONTROLS = frozenset({"toggle_mode", "more_seqs", "fewer_seqs", "double_seqs", "halve_seqs", "toggle_pause",
                           "step", "burst", "restart"})


def speed_label(speed: float) -> str:
    return "max speed" if math.isinf(speed) else f"{speed:g}x"


class EngineSource:
    layout = ENGINE_LAYOUT

    def __init__(self, engine: Engine, requests: list[Request] | tuple = (), *, session: Session | None = None,
                 peaks: DevicePeaks | None = None, device_label: str | None = None,
                 simulation: Simulation | None = None, pace: WallPace | None = None,
                 telemetry: TelemetrySampler | None = None, workload: dict | None = None,
                 serving_url: str | None = None, start_paused: bool = False, live_roofs: bool = False) -> None:
        """serving_url: a server's engine: out of work it is idle, waiting for requests, not finished.
        pace: a what-if engine's simulated time, kept to a multiple of wall time.
        live_roofs: measured roofs are measured again when the CPU kernels come in or a step beats them
        (core_engine/perf/live_roofs.py); the frames carry them."""
        self.engine = engine
        self.session = session or Session(engine, list(requests))
        engine.load_workload(self.session.workload)
        label = device_label or (f"{simulation.device.label} (simulated)" if simulation is not None
                                 else peaks.device_name if peaks is not None else engine.config.device)
        self.info = EngineInfo(engine.config, peaks, label, simulation=simulation, workload=workload,
                               telemetry=telemetry)
        self.serving_url = serving_url
        self.pace = pace
        self.controls = LIVE_CONTROLS | ({"slower", "faster"} if pace is not None else frozenset())
        self.notify: Notify = lambda kind, text: None
        self._sent = SentControls()
        self._watched = WatchedSession(self.session, self._sent, self._steps_done)
        self._with_pending: tuple[DashboardFrame, Pending, DashboardFrame] | None = None
        self.loop = RunLoop(self._watched, until_done=False, time=pace, stop_reason="quit", on_step=self._on_step,
                            on_idle=self._on_idle, on_restart=self._on_restart, paused=start_paused)
        self.started = threading.Event()  # set once the engine thread has entered run()
        self.runs = 1  # restarts so far + 1
        self.error: str | None = None
        self._finished_announced = False
        self._last_publish = 0.0
        self._builder = FrameBuilder()
        self._builder.observe(engine.snapshot())  # empty slots and the queue-to-be, before the first step
        self.roofs = (LiveRoofs(peaks, engine.config.device, engine.config.dtype, on_change=self._roofs_changed)
                      if live_roofs and simulation is None and LiveRoofs.applies(peaks) else None)
        self.frame: DashboardFrame = self._builder.frame(self._state())

    @property
    def frame(self) -> DashboardFrame:
        """The newest frame, with what the keys asked for that the engine has not applied yet (UI thread)."""
        frame, taken = self._published
        pending = self._pending(frame, taken)
        if not pending:
            return frame
        cached = self._with_pending
        if cached is None or cached[0] is not frame or cached[1] != pending:  # a new object only when it changes
            cached = self._with_pending = (frame, pending, replace(frame, pending=pending))
        return cached[2]

    @frame.setter
    def frame(self, frame: DashboardFrame) -> None:
        """The engine thread publishes a frame, with how many of the keys' commands it reflects."""
        self._published = (frame, self._watched.taken)

    def _pending(self, frame: DashboardFrame, taken: int) -> Pending:
        in_flight = self._watched.in_flight is not None and self._sent.count <= self._watched.taken
        return pending_over(frame.snapshot, frame.state, self._sent.after(taken), self.loop.paused,
                            self.engine.max_num_seqs_cap, in_flight)

    def _steps_done(self) -> int:
        last = self._builder.last
        return last.counters.steps if last is not None else 0

    def step_in_flight(self) -> tuple[int, float] | None:
        """(number, seconds so far) of a step in flight for longer than SLOW_STEP_S, at paint time."""
        in_flight = self._watched.in_flight
        if in_flight is None:
            return None
        number, began = in_flight
        seconds = wall.now() - began
        return (number, seconds) if seconds >= SLOW_STEP_S else None

    @property
    def done(self) -> threading.Event:
        return self.loop.done

    @property
    def paused(self) -> bool:
        return self.loop.paused

    @property
    def collector(self):
        """Metrics of the current run so far (read it once the engine thread has stopped or paused)."""
        return self._builder.collector

    # -- the worker thread ----------------------------------------------------------------------
    def run(self, is_cancelled: Callable[[], bool]) -> None:
        self.started.set()
        end = self.loop.run(is_cancelled)
        if end.reason == "error":  # the engine is dead; the UI stays up and says why
            self.error = end.error_text
            self._publish(force=True, sample=False)
            # a full disk under the trace is no bug: its message names the file, a traceback adds nothing
            details = "" if isinstance(end.error, OutputError) else "\n" + "".join(
                traceback.format_exception(end.error, limit=6))
            self.notify("error", self.error + details)
        elif end.reason == "script quit":
            self.notify("quit", "the script has ended the demo")

    def stop(self) -> None:
        self.loop.stop()

    def shut_down(self, reason: str, wait_s: float) -> None:
        """However the app ended (a signal before it drew, a step that outlived the quit's wait): stop
        the engine thread, give it `wait_s` to close the session itself, then close what is still open
        (the recorder takes a close from any thread; the engine thread writes nothing after it)."""
        self.loop.stop_reason = reason  # a loop still running ends with it too (a signal, not a quit)
        self.stop()
        if self.started.is_set():
            self.loop.done.wait(wait_s)
        recorder = self.session.recorder
        if recorder is not None and not recorder.closed:
            try:
                self.session.close(reason)
            except OutputError as exc:  # the screen has closed: the terminal is where it can still be said
                print(f"batchtop: {exc}", file=sys.stderr, flush=True)

    def wake(self) -> None:
        """Thread-safe: work has arrived (a server's request); an idle engine thread starts at once."""
        self.loop.wake()

    def _on_step(self, item: Stepped, forced: bool) -> None:
        if restarted(item.snapshot):
            self._builder = FrameBuilder()
        self._builder.observe(item.snapshot, item.text)
        if self.roofs is not None:
            self.roofs.observe(item.snapshot)  # may measure them again, here between two steps
        took_keys = self._watched.taken != self._published[1]  # at once: the pending mark goes as it is applied
        self._publish(force=forced or not item.is_step or took_keys, sample=item.is_step)

    def _roofs_changed(self, view: RoofsView) -> None:
        self._publish(force=True, sample=False)  # "re-measuring…" shows while the engine thread measures
        if not view.measuring and view.note:
            self.notify("info", view.note)

    def _on_restart(self, item: Stepped | None) -> None:
        self._finished_announced = False
        self.runs += 1
        if item is not None:
            self._on_step(item, True)

    def _on_idle(self) -> None:
        if (self.engine.is_done() and self.serving_url is None and not self._finished_announced
                and self._builder.last is not None):
            self._finished_announced = True
            self.notify("finished", "workload finished — press r to run it again")
        self._publish(force=True, sample=False)

    def _state(self) -> str:
        if self.error is not None:
            return "error"
        if self.loop.paused:
            return "paused"
        if self.engine.is_done():
            return "idle" if self.serving_url is not None else "finished"
        return "running"

    def _publish(self, force: bool = False, sample: bool = True) -> None:
        now = time.monotonic()
        if not force and now - self._last_publish < PUBLISH_INTERVAL_S:
            return
        self._last_publish = now
        if sample:
            self._builder.sample_rate()
        frame = self._builder.frame(self._state(), self.error, self.session.caption)
        self.frame = frame if self.roofs is None else replace(frame, roofs=self.roofs.view)

    # -- keys (the UI thread) ---------------------------------------------------------------------
    def act(self, name: str) -> str | None:
        return getattr(self, f"_act_{name}")()

    def current_max_num_seqs(self) -> int:
        snap = self.frame.snapshot
        return snap.max_num_seqs if snap is not None else self.engine.max_num_seqs

    def _send(self, command: control.Command) -> None:
        self._sent.send(self.engine.submit, command)
        self.loop.wake()

    def _act_toggle_mode(self) -> str:
        # relative commands: the engine applies each to the value in force then, so presses faster than
        # frames (or a script's change in between) compose instead of repeating a stale frame's value
        self._send(control.ToggleMode())
        return "static ⇄ continuous from the next admission (the status line shows the mode)"

    def _change_seqs(self, add: int = 0, multiply: float = 1.0) -> str | None:
        cap = self.engine.max_num_seqs_cap
        at_cap = (add > 0 or multiply > 1) and self.current_max_num_seqs() >= cap
        self._send(control.ChangeMaxNumSeqs(add, multiply))
        if at_cap:
            return (f"max_num_seqs is at its cap, {cap}: max_num_batched_tokens must hold every decode "
                    "(start with a larger --max-num-batched-tokens)")
        return None

    def _act_more_seqs(self) -> str | None:
        return self._change_seqs(add=1)

    def _act_fewer_seqs(self) -> str | None:
        return self._change_seqs(add=-1)

    def _act_double_seqs(self) -> str | None:
        return self._change_seqs(multiply=2)

    def _act_halve_seqs(self) -> str | None:
        return self._change_seqs(multiply=0.5)

    def _act_toggle_pause(self) -> None:
        self.loop.toggle_pause()

    def _act_step(self) -> str | None:
        if not self.loop.paused:
            return "n steps while paused: press space first"
        self.loop.step_once()
        return None

    def _act_burst(self) -> str:
        n = self.session.burst(max(8, self.current_max_num_seqs()))
        self.loop.wake()
        return f"burst: {n} requests arrive now"

    def _act_restart(self) -> str:
        self.loop.restart()
        return "restarting the workload from t=0"

    def _act_slower(self) -> str:
        return f"simulated time at {speed_label(self.pace.slower())} wall time"

    def _act_faster(self) -> str:
        return f"simulated time at {speed_label(self.pace.faster())} wall time"

    # -- the status line ----------------------------------------------------------------------------
    def status(self, frame: DashboardFrame, *, step_note: bool = True) -> str:
        """step_note: say how long a slow step has been in flight (PreparingSource says it with the kernels)."""
        parts = []
        flight = self.step_in_flight() if step_note else None
        if flight is not None:
            number, seconds = flight
            parts.append(f"step {number}: {seconds:.0f} s so far")
        if self.serving_url is not None:
            parts.append(f"serving {self.serving_url}")
        sim = self.info.simulation
        if sim is not None:
            text = f"{sim.tag} · {speed_label(self.pace.speed)}"
            if self.pace.behind and frame.state == "running":
                text += " (host-bound: slower)"  # simulating a step takes longer than the pace allows
            parts.append(text)
        extra = frame.error or frame.caption
        if extra:
            parts.append(extra)
        return " │ ".join(parts) if sim is not None else " · ".join(parts)
