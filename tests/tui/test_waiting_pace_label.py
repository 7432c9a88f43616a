"""The Waiting panel's footer says whether the closed-loop pacer is steering the arrivals or holding its
pace, from the running policy's trait (admits mid-batch), not from its name."""

from __future__ import annotations

from dataclasses import replace

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched import policies
from batchtop.core_engine.sched.static import StaticPolicy
from batchtop.tui.widgets.engine.waiting import pace_label
from tests.conftest import tiny_config


class Gang(StaticPolicy):  # another batch-at-a-time policy, registered for this test alone
    name = "gang"


def test_the_pace_is_held_under_every_policy_that_refills_only_between_batches(monkeypatch):
    monkeypatch.setitem(policies.POLICIES, Gang.name, Gang)
    snap = replace(Engine(tiny_config()).snapshot(), arrival_speed=1.5)
    assert pace_label(snap) == "paced 1.5x for ~80% busy"
    assert pace_label(replace(snap, mode="static")) == "pace held at 1.5x"
    assert pace_label(replace(snap, mode="gang")) == "pace held at 1.5x"
