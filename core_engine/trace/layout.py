"""Where each snapshot field sits in a trace's events, derived from the snapshot dataclasses.

A field added to StepSnapshot is written in the step event under its own name whenever it differs from
its default, read back (with its default from an older trace, which lacks it) and checked by its type
(field_types.py). A field added to Counters or StepCost joins the end of their lists, one added to
FinishedRequest the finish event, to WaitingView (a request's) the arrival event, to SlotView (a
slot's, per step) the end of the slot's cell. Give it a default, so older traces still load; nothing
here changes. The names below are the format of the first traces, kept so those still read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from batchtop.core_engine.engine.snapshot import Counters, FinishedRequest, SlotView, StepSnapshot, WaitingView
from batchtop.core_engine.model.cost import StepCost
from batchtop.core_engine.trace.field_types import FieldType, default_of, has_default, record_type, type_of

# StepSnapshot fields under a key of another name
RENAMED = {"t": "run_t", "num_free_blocks": "free_blocks", "num_pending_arrivals": "pending",
           "arrival_speed": "pace"}
# ... packed into one list, in this order (an older trace's list may lack the ones with defaults)
PACKED = {"times": ("step_time_s", "schedule_s", "prepare_s", "forward_s"),
          "tokens": ("num_prefill_tokens", "num_decode_tokens", "num_padding_tokens", "num_seqs",
                     "num_prompt_padding_tokens")}
# ... written by the codec's own code: requests by their index, block maps run-length encoded
CODED = ("slots", "waiting", "block_owners", "block_refs", "wait_reason", "counters", "cost", "decode_cost")
OWN_EVENTS = ("finished", "arrived", "rejected", "controls")  # each an event of its own before the step's
UNRECORDED = ("new_tokens",)  # the step's sampled tokens: with record_text their text is a "text" event
TEXT_ONLY = ("output_token_ids",)  # FinishedRequest fields written only with record_text
ARRIVAL_RENAMED = {"request_id": "id"}
PER_STEP_WAITING = ("num_preemptions",)  # the "waiting" list's pairs: [index, preemptions]
SLOT_CELL_HEAD = 2  # a slot's cell: [index, phase, the first two of CELL_FIELDS always, then the rest]
OLDEST_COUNTERS = 9  # the counters list of a trace from before prefix caching
COUNTERS = record_type(Counters, at_least=OLDEST_COUNTERS)
COST = record_type(StepCost, at_least=len(dataclasses.fields(StepCost)))


@dataclass(frozen=True)
class Named:
    """A dataclass field an event holds under a key of its own."""

    name: str
    key: str
    type: FieldType
    required: bool  # no default: every event has it
    default: object = None
    always: bool = False  # written even at its default

    def write(self, obj: object, out: dict) -> None:
        value = getattr(obj, self.name)
        if self.required or self.always or value != self.default:
            out[self.key] = self.type.encode(value)

    def read(self, event: dict) -> object:
        return self.type.decode(event[self.key]) if self.key in event else self.default


def named(cls: type, skip: tuple[str, ...] = (), renamed: dict[str, str] | None = None, always: bool = False,
          only: tuple[str, ...] | None = None) -> tuple[Named, ...]:
    """cls's fields (`only` these, when given) not in skip, each under its own key (or renamed's); a field
    with a default is written only when it differs from it, unless `always`."""
    return tuple(Named(f.name, (renamed or {}).get(f.name, f.name), type_of(cls, f.name), not has_default(f),
                       default_of(f) if has_default(f) else None, always)
                 for f in dataclasses.fields(cls) if f.name not in skip and (only is None or f.name in only))


@dataclass(frozen=True)
class Packed:
    """StepSnapshot fields packed into one list."""

    key: str
    fields: tuple[Named, ...]

    @property
    def at_least(self) -> int:
        return sum(f.required for f in self.fields)

    def write(self, obj: object, out: dict) -> None:
        out[self.key] = [f.type.encode(getattr(obj, f.name)) for f in self.fields]

    def read(self, event: dict) -> dict[str, object]:
        values = event[self.key]
        return {f.name: f.type.decode(values[i]) if i < len(values) else f.default for i, f in enumerate(self.fields)}


_PACKED = {n.name: n for n in named(StepSnapshot, only=tuple(n for names in PACKED.values() for n in names))}
PACKS = tuple(Packed(key, tuple(_PACKED[name] for name in names)) for key, names in PACKED.items())
STEP_NAMED = named(StepSnapshot, skip=(*_PACKED, *CODED, *OWN_EVENTS, *UNRECORDED), renamed=RENAMED)
FINISH = named(FinishedRequest, always=True)
ARRIVAL = named(WaitingView, skip=PER_STEP_WAITING, renamed=ARRIVAL_RENAMED)
# a slot's own numbers for the step; the rest of a SlotView is its request's (from the arrival event)
_REQUEST = {f.name for f in dataclasses.fields(WaitingView)}
CELL_FIELDS = named(SlotView, skip=("slot", "phase", *_REQUEST))
REQUEST_FIELDS = tuple(f.name for f in dataclasses.fields(SlotView) if f.name in _REQUEST and f.name != "index")


def cell_values(slot: SlotView) -> list:
    """The slot's CELL_FIELDS values, those past SLOT_CELL_HEAD left off from the last one at its default."""
    values = [getattr(slot, f.name) for f in CELL_FIELDS]
    keep = len(values)
    while keep > SLOT_CELL_HEAD and values[keep - 1] == CELL_FIELDS[keep - 1].default:
        keep -= 1
    return [f.type.encode(v) for f, v in zip(CELL_FIELDS, values[:keep])]


def cell_fields(values: list) -> dict[str, object]:
    return {f.name: f.type.decode(values[i]) if i < len(values) else f.default for i, f in enumerate(CELL_FIELDS)}
