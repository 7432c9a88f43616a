"""The teaching text's step loop: how many forward steps static and continuous batching need.

Each step every running sequence produces one token; continuous refills a freed slot at the next
step, static refills only when the whole batch has finished. No model, no time: just counting.
"""

from __future__ import annotations

from collections import deque


def continuous_steps(lengths: list[int], slots: int) -> tuple[int, int]:
    """(steps, busy slot-steps) of iteration-level scheduling."""
    waiting, running, steps, busy = deque(lengths), [], 0, 0
    while waiting or running:
        while waiting and len(running) < slots:
            running.append(waiting.popleft())
        steps += 1
        busy += len(running)
        running = [n - 1 for n in running if n > 1]
    return steps, busy


def static_steps(lengths: list[int], slots: int) -> tuple[int, int]:
    """(steps, busy slot-steps) of batch-level scheduling: each batch runs as long as its longest."""
    steps = busy = 0
    for i in range(0, len(lengths), slots):
        batch = lengths[i:i + slots]
        steps += max(batch)
        busy += sum(batch)
    return steps, busy
