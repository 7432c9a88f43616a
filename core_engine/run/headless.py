"""The no-screen driver behind `--headless` and `compare`: run a workload to the end, fold metrics.

It owns no scheduling logic: it only calls Engine.step(), waits for arrivals when idle (a simulated
engine's virtual clock jumps to them instead), and lets its Session play a script and record a trace.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.perf.metrics import MetricsCollector
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.run.session import Session
from batchtop.core_engine.run.stop import StopRequest, Terminated
from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.core_engine.simulate.clock import VirtualClock

IDLE_POLL_S = 0.05


@dataclass
class RunResult:
    collector: MetricsCollector
    complete: bool = True
    error: BaseException | None = None
    stopped_by_script: bool = False
    signal: int | None = None  # the signal that interrupted it (SIGINT, SIGTERM)

    @property
    def interrupted(self) -> bool:
        return self.signal is not None

    @property
    def end_reason(self) -> str:
        if self.error is not None:
            return "error"
        if self.interrupted:
            return "interrupted"
        return "script quit" if self.stopped_by_script else "finished"


def idle_wait(engine: Engine) -> Callable[[float], None]:
    """How to wait `seconds` of engine time for the next arrival: a virtual clock jumps there, a real
    one is polled (so controls and Ctrl-C stay responsive)."""
    if isinstance(engine.clock, VirtualClock):
        return engine.clock.advance
    return lambda seconds: time.sleep(min(seconds, IDLE_POLL_S))


def drive(engine: Engine, session: Session | None = None, *,
          on_step: Callable[[StepSnapshot], None] | None = None,
          sleep: Callable[[float], None] | None = None) -> RunResult:
    """Step until the workload is done (or the script quits); never raises for an engine error or Ctrl-C.

    Ctrl-C and SIGTERM stop it at the next step boundary (see session.stop)."""
    session = session or Session(engine, [])
    sleep = sleep or idle_wait(engine)
    result = RunResult(MetricsCollector())
    stop = StopRequest()
    try:
        with stop.installed():
            _loop(engine, session, result, stop, on_step, sleep)
    except KeyboardInterrupt as exc:  # a second Ctrl-C, or a run outside the main thread
        result.complete = False
        result.signal = signal.SIGTERM if isinstance(exc, Terminated) else stop.signal or signal.SIGINT
    except Exception as exc:  # an engine failure: report it, keep what was measured
        result.complete, result.error = False, exc
    error = None if result.error is None else f"{type(result.error).__name__}: {result.error}"
    session.close(result.end_reason, error)
    return result


def _loop(engine: Engine, session: Session, result: RunResult, stop: StopRequest,
          on_step: Callable[[StepSnapshot], None] | None, sleep: Callable[[float], None]) -> None:
    while not engine.is_done():
        if stop:
            result.complete, result.signal = False, stop.signal
            return
        session.before_step()
        if session.quit_requested:
            result.complete, result.stopped_by_script = False, True
            return
        snap = engine.step()
        session.after_step(snap)
        result.collector.observe(snap)
        if on_step is not None:
            on_step(snap)
        if not snap.is_step:
            wait = session.seconds_until_next_event()
            if wait:
                sleep(wait)


def run_workload(engine: Engine, requests: list[Request], session: Session | None = None, **kwargs) -> RunResult:
    engine.load_workload(requests)
    return drive(engine, session or Session(engine, requests), **kwargs)
