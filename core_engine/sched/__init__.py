"""One scheduler; the policies it runs (continuous, static, ...) come from one registry (policies.py)."""

from batchtop.core_engine.sched.scheduler import Scheduler, SchedulerOutput, SchedulingPolicy
from batchtop.core_engine.sched.continuous import ContinuousPolicy
from batchtop.core_engine.sched.static import StaticPolicy
from batchtop.core_engine.sched.policies import POLICIES, make_policy, policy_class

__all__ = ["POLICIES", "ContinuousPolicy", "Scheduler", "SchedulerOutput", "SchedulingPolicy",
           "StaticPolicy", "make_policy", "policy_class"]
