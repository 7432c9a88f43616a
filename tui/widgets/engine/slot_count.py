"""The slots against max_num_seqs, counted once for every panel that states them (the Slots title and
grid, the timelines' range, Waiting, the metrics strip), so no two of them can disagree.

Lowering max_num_seqs drops no running sequence: those in slots past the new limit keep running until
they finish (they drain), and the grid shrinks as they leave. They are not counted as busy slots of the
new limit; the vacancies under it that they count against are held, not bubbles
(StepSnapshot.held_by_drain); vacant slots past the limit are no slots at all (retired).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from batchtop.core_engine.sched.request import Phase
from batchtop.core_engine.engine.snapshot import HOLDING_PHASES, WORKING_PHASES, SlotState, StepSnapshot


class SlotRole(enum.Enum):
    SLOT = "slot"  # one of max_num_seqs slots (or a sequence that finished past the limit in this step)
    DRAINING = "draining"  # past the limit, its sequence still running
    HELD = "held"  # vacant under the limit, counted against by a draining sequence
    RETIRED = "retired"  # vacant past the limit: no longer a slot


@dataclass(frozen=True, slots=True)
class SlotCount:
    limit: int  # max_num_seqs now
    busy: int  # prefilling or decoding in slots under the limit
    draining: int  # sequences still holding a slot past the limit
    held: int
    bubbles: int
    padding: int  # static batching's finished members, still computed
    finished: int  # sequences that finished in this step (shown ✓ for one frame)
    roles: tuple[SlotRole, ...]  # by slot

    @property
    def rows(self) -> int:
        """Slots the grid and the timelines show: the limit, or up to the last draining sequence."""
        return len(self.roles)

    def range_label(self) -> str:
        """How many slots there are now: "16", or "16 + 2 draining" while a lowered limit drains."""
        return f"{self.limit} + {self.draining} draining" if self.draining else f"{self.limit}"


def slot_role(phase: Phase, slot: int, limit: int, held: frozenset[int]) -> SlotRole:
    if slot >= limit:
        if phase in HOLDING_PHASES:
            return SlotRole.DRAINING
        return SlotRole.RETIRED if phase is Phase.EMPTY else SlotRole.SLOT
    return SlotRole.HELD if slot in held else SlotRole.SLOT


def count_slots(snap: StepSnapshot) -> SlotCount:
    limit, held = snap.max_num_seqs, snap.held_by_drain()
    roles = [slot_role(s.phase, s.slot, limit, held) for s in snap.slots]
    # the grid ends at the last slot that is one (the limit) or shows something (a draining or finished one)
    while len(roles) > limit and roles[-1] is SlotRole.RETIRED:
        roles.pop()
    under = snap.slots[:limit]
    return SlotCount(
        limit=limit, busy=sum(s.phase in WORKING_PHASES for s in under),
        draining=roles.count(SlotRole.DRAINING), held=len(held),
        bubbles=snap.slot_states().count(SlotState.BUBBLE),
        padding=sum(s.phase is Phase.PADDING for s in under),
        finished=sum(s.phase is Phase.FINISHED for s in snap.slots), roles=tuple(roles))
