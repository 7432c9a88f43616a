"""Bringing batchtop's CPU kernels in between two steps, once their background build has finished: the
engine keeps stepping on the torch ops until then, and from the next step on runs the kernels. That
step's snapshot carries the KERNELS_IN control, and what was measured on the torch ops is measured again
on the kernels after it (perf/live_roofs.py: the roofs), not inside it, where the step's time would
pay for the measurement."""

from __future__ import annotations

from batchtop.core_engine.model.packed_linear import packing
from batchtop.gpu_kernels import cpu_kernels

KERNELS_IN = ("cpu_kernels", "in")  # the control the engine records on the first step the kernels run


def switch_in_built_kernels(runner: object) -> bool:
    """True when the kernels came in now. Choices of path made once are made again: the linear layers'
    packing (their weights are repacked for the kernels' layout on their next call) and the runner's
    attention backend."""
    if not cpu_kernels.switch_in():
        return False
    packing.cache_clear()
    if hasattr(runner, "select_attention_backend"):  # the real ModelRunner; a simulated one has no kernels to pick
        runner.select_attention_backend()
    return True


def kernels_came_in(controls: object) -> bool:
    """Whether a step's controls say the kernels came in before it (its snapshot's `controls`)."""
    return any(tuple(control) == KERNELS_IN for control in controls)
