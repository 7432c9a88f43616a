"""Bringing batchtop's CPU kernels in between two steps, once their background build has finished: the
engine keeps stepping on the torch ops until then, and from the next step on runs the kernels."""

from __future__ import annotations

from batchtop.core_engine.model.packed_linear import packing
from batchtop.gpu_kernels import cpu_kernels, uses_cpu_kernel


def switch_in_built_kernels(runner: object) -> bool:
    """True when the kernels came in now. Choices of path made once are made again: the linear layers'
    packing (their weights are repacked for the kernels' layout on their next call) and whether prompt
    chunks join the decode rows in one attention call."""
    if not cpu_kernels.switch_in():
        return False
    packing.cache_clear()
    if hasattr(runner, "varlen_prompts"):  # the real ModelRunner; a simulated one has no kernels to pick
        runner.varlen_prompts = uses_cpu_kernel(runner.device, runner.dtype, runner.config.model.head_dim)
    return True
