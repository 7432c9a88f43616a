"""The no-screen driver behind `--headless` and `compare`: run a workload to the end, fold metrics.

It owns no loop of its own: it steps a Session through the RunLoop until the work is done, with
Ctrl-C and SIGTERM stopping it at a step boundary; a simulated engine's clock jumps to each arrival.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.perf.metrics import MetricsCollector
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.run.loop import JumpTime, RunLoop, RunTime, Stepped, WallTime
from batchtop.core_engine.run.live_session import Session
from batchtop.core_engine.run.stop import StopRequest, Terminated
from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.core_engine.simulate.clock import VirtualClock


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


def run_time(engine: Engine) -> RunTime:
    """A simulated engine's virtual clock jumps to the next arrival; a real one waits for it."""
    return JumpTime(engine.clock) if isinstance(engine.clock, VirtualClock) else WallTime()


def drive(engine: Engine, session: Session | None = None, *,
          on_step: Callable[[StepSnapshot], None] | None = None, time: RunTime | None = None) -> RunResult:
    """Step until the workload is done (or the script quits); never raises for an engine error or Ctrl-C.

    Ctrl-C and SIGTERM stop it at the next step boundary (see run.stop)."""
    session = session or Session(engine, [])
    result = RunResult(MetricsCollector())

    def observe(item: Stepped, forced: bool) -> None:
        result.collector.observe(item.snapshot)
        if on_step is not None:
            on_step(item.snapshot)

    stop = StopRequest()
    loop = RunLoop(session, until_done=True, time=time or run_time(engine), stop_reason="interrupted", on_step=observe)
    try:
        with stop.installed():
            end = loop.run(lambda: bool(stop))
    except KeyboardInterrupt as exc:  # a second Ctrl-C, or a run outside the main thread
        result.complete = False
        result.signal = signal.SIGTERM if isinstance(exc, Terminated) else stop.signal or signal.SIGINT
        return result
    result.complete = end.reason == "finished"
    result.error = end.error
    result.stopped_by_script = end.reason == "script quit"
    if end.reason == "interrupted":
        result.signal = stop.signal
    return result


def run_workload(engine: Engine, requests: list[Request], session: Session | None = None, **kwargs) -> RunResult:
    engine.load_workload(requests)
    return drive(engine, session or Session(engine, requests), **kwargs)
