"""The no-screen driver behind `--headless` and `compare`: run a workload to the end, fold metrics.

It owns no scheduling logic: it only calls Engine.step() and waits for arrivals when idle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from core_engine.engine import Engine
from core_engine.metrics import MetricsCollector
from core_engine.request import Request
from core_engine.snapshot import StepSnapshot

IDLE_POLL_S = 0.05


@dataclass
class RunResult:
    collector: MetricsCollector
    complete: bool = True
    error: BaseException | None = None
    interrupted: bool = False
    rejections: list[tuple[str, str]] = field(default_factory=list)


def drive(engine: Engine, *, on_step: Callable[[StepSnapshot], None] | None = None,
          should_stop: Callable[[], bool] = lambda: False, sleep: Callable[[float], None] = time.sleep) -> RunResult:
    """Step until the workload is done (or should_stop); never raises for an engine error or Ctrl-C."""
    result = RunResult(MetricsCollector())
    try:
        while not engine.is_done():
            if should_stop():
                result.complete = False
                break
            snap = engine.step()
            if snap is None:
                wait = engine.seconds_until_next_arrival()
                if wait:
                    sleep(min(wait, IDLE_POLL_S))
                continue
            result.collector.observe(snap)
            if on_step is not None:
                on_step(snap)
    except KeyboardInterrupt:
        result.complete, result.interrupted = False, True
    except Exception as exc:  # an engine failure: report it, keep what was measured
        result.complete, result.error = False, exc
    result.rejections = list(engine.rejections)
    return result


def run_workload(engine: Engine, requests: list[Request], **kwargs) -> RunResult:
    engine.load_workload(requests)
    return drive(engine, **kwargs)
