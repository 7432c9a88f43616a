"""One scheduler, two admission policies: continuous (iteration-level) and static (batch-level)."""

from batchtop.core_engine.sched.scheduler import Scheduler, SchedulerOutput, SchedulingPolicy
from batchtop.core_engine.sched.continuous import ContinuousPolicy
from batchtop.core_engine.sched.static import StaticPolicy

POLICIES: dict[str, type] = {"continuous": ContinuousPolicy, "static": StaticPolicy}


def make_policy(mode: str) -> SchedulingPolicy:
    return POLICIES[mode]()


__all__ = ["POLICIES", "ContinuousPolicy", "Scheduler", "SchedulerOutput", "SchedulingPolicy",
           "StaticPolicy", "make_policy"]
