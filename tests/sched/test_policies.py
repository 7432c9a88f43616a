"""One registry of scheduling policies: modes, traits and hooks come from it, and a new policy is one
subclass plus its registry line (here registered for the test alone, by monkeypatching)."""

from __future__ import annotations

import pytest

from batchtop.core_engine.config import MODES
from batchtop.core_engine.engine import control
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.sched import policies
from batchtop.core_engine.sched.continuous import ContinuousPolicy
from batchtop.core_engine.sched.request import Phase, Request
from batchtop.core_engine.trace.codec import settled_phases
from batchtop.tui.cli.options import _OPTIONS
from tests.conftest import run_all, tiny_config


class ShortestPromptFirst(ContinuousPolicy):
    name = "spf"
    label = "shortest prompt first"
    description = "continuous batching that admits the shortest waiting prompt first"

    def admission_order(self, waiting):
        return sorted(waiting, key=lambda seq: (seq.prompt_len, seq.index))


class OldestPreemptedFirst(ContinuousPolicy):
    name = "oldest-out"
    label = "oldest preempted first"
    description = "continuous batching that evicts the longest-running sequence under memory pressure"

    def preemption_victim(self, candidates):
        return candidates[0]


@pytest.fixture
def registered(monkeypatch):
    def register(policy):
        monkeypatch.setitem(policies.POLICIES, policy.name, policy)
        return policy.name
    return register


def test_every_mode_name_comes_from_the_one_registry():
    assert MODES == tuple(policies.POLICIES) == ("continuous", "static")
    mode_option = next(o for o in (opt(lambda: None).__click_params__[0] for opt in _OPTIONS) if o.name == "mode")
    assert tuple(mode_option.type.choices) == MODES and mode_option.default == policies.DEFAULT_MODE
    assert all(p.description in mode_option.help for p in policies.POLICIES.values())


def test_a_mode_outside_the_registry_is_refused_naming_the_registered_ones(registered):
    with pytest.raises(ConfigError, match="must be one of continuous, static, got 'spf'"):
        tiny_config(mode="spf")
    with pytest.raises(ValueError, match="continuous, static"):
        Engine(tiny_config()).submit(control.SetMode("spf"))
    registered(ShortestPromptFirst)
    assert tiny_config(mode="spf").mode == "spf"


def test_a_shortest_prompt_first_policy_runs_end_to_end_from_one_subclass(registered):
    requests = [Request(f"r{n}", tuple(range(2, 2 + n)), 3) for n in (9, 3, 6, 1)]
    fifo = Engine(tiny_config(max_num_seqs=1))
    spf = Engine(tiny_config(mode=registered(ShortestPromptFirst), max_num_seqs=1), runner=fifo.runner)
    outputs = {}
    for name, engine in (("fifo", fifo), ("spf", spf)):
        outputs[name], snaps, _ = run_all(engine, requests, check=lambda e, s: e.scheduler.check_invariants())
        order = [f.request_id for s in snaps for f in s.finished]
        if name == "fifo":
            assert order == ["r9", "r3", "r6", "r1"]
        else:
            assert order == ["r1", "r3", "r6", "r9"]
            assert [w.request_id for w in snaps[0].waiting] == ["r3", "r6", "r9"]  # the queue as it will run
            assert {s.mode for s in snaps} == {"spf"}
    assert outputs["spf"] == outputs["fifo"]  # same requests, same tokens; only the order changed


def test_the_toggle_key_cycles_through_every_registered_mode(registered):
    registered(ShortestPromptFirst)
    engine = Engine(tiny_config())
    seen = []
    for _ in range(3):
        engine.apply(control.ToggleMode())
        seen.append(engine.mode)
    assert seen == ["static", "spf", "continuous"]


def run_until_preempted(engine: Engine) -> None:
    engine.load_workload([Request("old", (2, 3, 4, 5), 10), Request("new", (6, 7, 8, 9), 10)])
    for _ in range(50):
        if engine.counters.preemptions:
            return
        engine.step()
        engine.scheduler.check_invariants()
    raise AssertionError("no preemption in 50 steps")


def test_the_preemption_victim_is_the_policys_choice(registered):
    """Two requests share a pool that holds both only until their third block: one is evicted."""
    default = Engine(tiny_config(num_kv_blocks=4))
    run_until_preempted(default)
    assert [s.id for s in default.scheduler.waiting] == ["new"]  # vLLM's choice: the last admitted
    custom = Engine(tiny_config(mode=registered(OldestPreemptedFirst), num_kv_blocks=4), runner=default.runner)
    run_until_preempted(custom)
    assert [s.id for s in custom.scheduler.waiting] == ["old"]
    assert [s.id for s in custom.scheduler.running] == ["new"]
    outputs, _, _ = run_all(custom)
    assert sorted(outputs) == ["new", "old"] and all(len(t) == 10 for t in outputs.values())


def test_trace_phases_read_the_padding_trait_not_the_mode_name(registered):
    """A slot that finished mid-step in an old recording: released, unless the policy pads finished rows."""
    cells, finished = [[0, "d", 4, 2], [1, "d", 4, 3]], {0}
    assert settled_phases(cells, finished, "static") == [Phase.PADDING, Phase.DECODE]
    assert settled_phases(cells, finished, "continuous") == [Phase.FINISHED, Phase.DECODE]
    assert settled_phases(cells, finished, registered(ShortestPromptFirst)) == [Phase.FINISHED, Phase.DECODE]
