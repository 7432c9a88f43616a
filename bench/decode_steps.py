"""Shared by the decode benches: B same-length sequences decoding together, one snapshot per step."""

from __future__ import annotations

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.engine.request import Request


def decode_steps(engine: Engine, batch: int, context: int, steps: int) -> list:
    """Snapshots of `steps` pure-decode steps at exactly `batch` rows, after one warm-up step
    (its allocator and cache misses would overstate the cost)."""
    engine.load_workload([Request(f"b{batch}-{i}", tuple(range(1, context + 1)), steps + 4) for i in range(batch)])
    snaps = []
    while not engine.is_done():
        snap = engine.step()
        if snap.is_step and snap.num_prefill_tokens == 0 and snap.num_seqs == batch:
            snaps.append(snap)
    return snaps[1:steps + 1]
