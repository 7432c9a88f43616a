"""Why the head of the queue is still waiting: decided by the scheduler, only displayed by panels."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class WaitKind(str, enum.Enum):
    STATIC_BATCH = "static_batch"  # head-of-line blocked: a static batch runs until its last member ends
    SLOTS_FULL = "slots_full"  # max_num_seqs sequences already run
    KV_FULL = "kv_full"  # not enough free KV blocks (the admission watermark included)
    TOKEN_BUDGET = "token_budget"  # this step's max_num_batched_tokens is spent


@dataclass(frozen=True, slots=True)
class WaitReason:
    kind: WaitKind
    message: str  # the whole reason, with its numbers
    short: str  # the same for a narrow panel

    def text(self, width: int) -> str:
        return self.message if len(self.message) <= width else self.short

    def after_step(self, freed_slots: int) -> WaitReason:
        """The reason as the step leaves it: a slot reason decided at admission no longer holds once
        sequences have left their slots at the end of the step (the snapshot's moment)."""
        if not freed_slots or self.kind not in (WaitKind.SLOTS_FULL, WaitKind.STATIC_BATCH):
            return self
        if self.kind is WaitKind.STATIC_BATCH:
            return WaitReason(self.kind, "static batch ended in this step: the next batch is admitted at the next step",
                              "static batch ended: next batch next")
        slots = f"{freed_slots} slot{'s' * (freed_slots != 1)}"
        return WaitReason(self.kind, f"{self.message}; {slots} freed at the end of this step",
                          f"{self.short}, {freed_slots} freed")

    @staticmethod
    def static_batch(size: int) -> WaitReason:
        return WaitReason(WaitKind.STATIC_BATCH,
                          f"static batch of {size} running: head-of-line blocked until its last member ends",
                          "HOL: static batch running")

    @staticmethod
    def slots_full(running: int, max_num_seqs: int) -> WaitReason:
        return WaitReason(WaitKind.SLOTS_FULL, f"slots full: {running} running, max_num_seqs={max_num_seqs}",
                          f"slots full {running}/{max_num_seqs}")

    @staticmethod
    def kv_full(need: int, watermark: int, free: int) -> WaitReason:
        mark = f" + {watermark} watermark" if watermark else ""
        return WaitReason(WaitKind.KV_FULL, f"KV full: head needs {need} blocks{mark}, {free} free",
                          f"KV full: {need + watermark} > {free} free")

    @staticmethod
    def kv_static(admitted: int, need: int, free: int) -> WaitReason:
        return WaitReason(WaitKind.KV_FULL,
                          f"KV full: static batch limited to {admitted}; head needs {need} blocks "
                          f"(prompt + max_tokens), {free} free",
                          f"KV full: batch of {admitted}, {need} > {free}")

    @staticmethod
    def preempted() -> WaitReason:
        return WaitReason(WaitKind.KV_FULL, "KV full: a sequence was preempted this step", "KV full: preempting")

    @staticmethod
    def token_budget(budget: int) -> WaitReason:
        return WaitReason(WaitKind.TOKEN_BUDGET, f"token budget spent: {budget} tokens this step",
                          f"budget {budget} spent")
