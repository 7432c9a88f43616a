"""A step's plan as forwards of at most max_num_batched_tokens tokens each.

Continuous batching never plans more than the budget. A static batch does: generate() has no token
budget, so its members' prompts, left-padded to the longest, form one prefill of members x longest
tokens (128 prompts padded to 4,107 tokens made one 525,696-token forward and a CUDA out-of-memory
on a 141 GB card). The runner keeps the step as the scheduler planned it, pad tokens and all, and
runs it as several forwards in plan order, each within the budget, so a forward's activations never
outgrow what the budget promised. Plan order keeps same-step prefix sharing correct: a block a later
member finds cached was written by an earlier member's tokens, which run in this or an earlier piece.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batchtop.core_engine.sched import SchedulerOutput
from batchtop.core_engine.sched.request import Sequence


@dataclass(slots=True)
class ForwardPiece:
    """One forward: one-token rows first, then prompt chunks (seq, first position, tokens), then pad chunks."""

    decodes: list[Sequence] = field(default_factory=list)
    padding: list[Sequence] = field(default_factory=list)  # static batching's finished rows
    prefills: list[tuple[Sequence, int, int]] = field(default_factory=list)
    prompt_padding: list[int] = field(default_factory=list)  # lengths of left-padding chunks

    def sampled(self) -> list[Sequence]:
        """The sequences this forward samples a token for, in row order: decodes, then completed prompts."""
        return self.decodes + [seq for seq, start, n in self.prefills if start + n == seq.num_tokens]

    @property
    def num_tokens(self) -> int:
        return (len(self.decodes) + len(self.padding) + sum(n for _, _, n in self.prefills)
                + sum(self.prompt_padding))


def split_to_budget(plan: SchedulerOutput, budget: int) -> list[ForwardPiece]:
    """The plan as pieces of at most `budget` tokens (one piece when it fits). One-token rows all go
    to the first piece (they are at most max_num_seqs, which the budget bounds); a prompt chunk or a
    pad chunk longer than what is left of a piece continues in the next one."""
    first = ForwardPiece(decodes=[seq for seq, _ in plan.scheduled if not seq.is_prefill],
                         padding=list(plan.padding))
    pieces = [first]
    room = budget - first.num_tokens

    def runs(n: int):
        """(piece, offset, length) runs of n tokens, opening a new piece whenever one fills."""
        nonlocal room
        offset = 0
        while offset < n:
            if room <= 0:
                pieces.append(ForwardPiece())
                room = budget
            m = min(n - offset, room)
            room -= m
            yield pieces[-1], offset, m
            offset += m

    for seq, n in plan.scheduled:
        if seq.is_prefill:
            for piece, offset, m in runs(n):
                piece.prefills.append((seq, seq.num_computed_tokens + offset, m))
    for _, n in plan.prompt_padding:
        for piece, _, m in runs(n):
            piece.prompt_padding.append(m)
    return pieces
