"""StepSnapshot <-> compact JSON events, for the batchtop.trace format.

A snapshot becomes, in order: its control events, its arrivals, its rejections, its finished requests,
then one "step" event when a forward ran, or a "view" event (the same fields, step 0) when something
happened between steps: a replay then ends at the same run time and counters as the live run did.
Requests are named by their index; the arrival event carries the id and lengths once. Block
ownership ("kv") and, with prefix caching, holders per block ("kv_refs") are run-length encoded and
omitted when unchanged. Which field goes where follows from the snapshot dataclasses (layout.py):
a field added to one is recorded and read back with no change here.

A slot's phase is its state once the step is over ("f": released in it, its KV freed). A trace from
before that field records what the slot did in the step instead; it is read into the same model
(see `settled_phases`), so an old recording replays as a new one shows.
"""

from __future__ import annotations

from dataclasses import replace

from batchtop.core_engine.sched.policies import policy_class
from batchtop.core_engine.sched.request import Phase
from batchtop.core_engine.sched.wait_reason import WaitKind, WaitReason
from batchtop.core_engine.engine.detokenizer import TextDelta
from batchtop.core_engine.engine.snapshot import FinishedRequest, SlotView, StepSnapshot, WaitingView
from batchtop.core_engine.model.cost import StepCost
from batchtop.core_engine.trace.layout import (ARRIVAL, COST, COUNTERS, FINISH, PACKS, REQUEST_FIELDS, STEP_NAMED,
                                               TEXT_ONLY, cell_fields, cell_values)

PHASE_CODE = {Phase.PREFILL: "p", Phase.DECODE: "d", Phase.PADDING: "x", Phase.IDLE: "i", Phase.FINISHED: "f"}
CODE_PHASE = {v: k for k, v in PHASE_CODE.items()}


def run_length(owners: tuple[int, ...]) -> list[int]:
    out: list[int] = []
    for owner in owners:
        if out and out[-2] == owner:
            out[-1] += 1
        else:
            out += [owner, 1]
    return out


def expand(runs: list[int], max_blocks: int | None = None) -> tuple[int, ...]:
    """The block map back from its runs; ValueError when it covers more blocks than the pool has
    (a damaged count must not become a billion-entry list)."""
    total = sum(runs[1::2])
    if max_blocks is not None and total > max_blocks:
        raise ValueError(f"the block map covers {total} blocks, the pool has {max_blocks}")
    out: list[int] = []
    for owner, count in zip(runs[::2], runs[1::2]):
        out += [owner] * count
    return tuple(out)


class SnapshotEncoder:
    """Turns snapshots into trace events; remembers the last block map to send only changes.

    What users typed and what the model answered is recorded only when asked (record_text): then a
    "text" event before each step carries that step's TextDelta and finish events carry the output
    token ids; otherwise neither is written."""

    def __init__(self, record_text: bool = False) -> None:
        self._owners: tuple[int, ...] | None = None
        self._refs: tuple[int, ...] = ()
        self.record_text = record_text

    def events(self, snap: StepSnapshot, text: TextDelta | None = None) -> list[dict]:
        out: list[dict] = [{"type": "control", "name": name, "value": value} for name, value in snap.controls]
        if any(name == "reset" for name, _ in snap.controls):
            self._owners, self._refs = None, ()
        out += [_written("arrival", a, ARRIVAL) for a in snap.arrived]
        out += [{"type": "reject", "id": rid, "reason": reason} for rid, reason in snap.rejected]
        finish = FINISH if self.record_text else tuple(f for f in FINISH if f.name not in TEXT_ONLY)
        out += [_written("finish", f, finish) for f in snap.finished]
        if self.record_text and text:
            out.append(text.as_event())
        if snap.is_step or out:
            out.append(self._step(snap))
        return out

    def _step(self, snap: StepSnapshot) -> dict:
        event = _written("step" if snap.is_step else "view", snap, STEP_NAMED)
        for pack in PACKS:
            pack.write(snap, event)
        event["slots"] = [0 if s.phase is Phase.EMPTY else _slot_cell(s) for s in snap.slots]
        event["waiting"] = [x for w in snap.waiting for x in (w.index, w.num_preemptions)]
        event["counters"] = COUNTERS.encode(snap.counters)
        event["cost"] = COST.encode(snap.cost)
        if snap.num_prefill_tokens and snap.decode_cost.bytes > 0:  # decode rows beside a prompt chunk
            event["decode_cost"] = COST.encode(snap.decode_cost)
        if snap.wait_reason is not None:
            r = snap.wait_reason
            event["wait"] = [r.kind.value, r.message, r.short]
        if snap.block_owners != self._owners:
            event["kv"] = run_length(snap.block_owners)
            self._owners = snap.block_owners
        if snap.block_refs != self._refs:
            event["kv_refs"] = run_length(snap.block_refs)
            self._refs = snap.block_refs
        return event


def _written(kind: str, obj: object, fields) -> dict:
    event = {"type": kind}
    for f in fields:
        f.write(obj, event)
    return event


def settled_phases(cells: list, finished: set[int], mode: str) -> list[Phase]:
    """Each recorded slot's phase once its step is over. A trace written before the FINISHED phase shows
    a sequence that finished in the step as decoding ("d"); this reads it as the engine now reports it:
    released (FINISHED) under continuous batching, or when its static batch ends with it (every member
    then released, padding rows too); otherwise a static member that finished stays on as PADDING. A
    newer trace never records a finished sequence as working, so nothing changes for it."""
    phases = [Phase.EMPTY if cell == 0 else CODE_PHASE[cell[1]] for cell in cells]
    ended = [i for i, (cell, p) in enumerate(zip(cells, phases))
             if p in (Phase.PREFILL, Phase.DECODE) and cell[0] in finished]
    if not ended:
        return phases
    if not policy_class(mode).pads_finished_rows:
        return [Phase.FINISHED if i in ended else p for i, p in enumerate(phases)]
    batch_over = all(p in (Phase.EMPTY, Phase.PADDING, Phase.FINISHED) or i in ended for i, p in enumerate(phases))
    if batch_over:
        return [Phase.EMPTY if p is Phase.EMPTY else Phase.FINISHED for p in phases]
    return [Phase.PADDING if i in ended else p for i, p in enumerate(phases)]


def _slot_cell(s: SlotView) -> list:
    """[index, phase, computed, generated], then prompt padding, then cached tokens (and any later
    SlotView field), those at their defaults left off the end."""
    return [s.index, PHASE_CODE[s.phase], *cell_values(s)]


class SnapshotDecoder:
    """Rebuilds StepSnapshots from events in file order; raises ValueError on an inconsistent event."""

    def __init__(self, max_blocks: int | None = None) -> None:
        self.max_blocks = max_blocks  # the recorded pool's size, when the header gives it
        self._requests: dict[int, WaitingView] = {}
        self._owners: tuple[int, ...] = ()
        self._refs: tuple[int, ...] = ()  # a trace from before prefix caching has none: the map shows owners
        self._pending: dict[str, list] = {"arrived": [], "rejected": [], "finished": [], "controls": []}

    def feed(self, event: dict) -> StepSnapshot | None:
        """Take one event; return a snapshot when it completes one (a step or view event)."""
        kind = event["type"]
        if kind == "control":
            self._pending["controls"].append((event["name"], event.get("value")))
            if event["name"] == "reset":
                self._requests.clear()
        elif kind == "arrival":
            view = WaitingView(**{f.name: f.read(event) for f in ARRIVAL}, num_preemptions=0)
            self._requests[view.index] = view
            self._pending["arrived"].append(view)
        elif kind == "reject":
            self._pending["rejected"].append((event["id"], event["reason"]))
        elif kind == "finish":
            # output_token_ids only when recorded with --record-text: () otherwise
            self._pending["finished"].append(FinishedRequest(**{f.name: f.read(event) for f in FINISH}))
        elif kind == "text":
            TextDelta.from_event(event)  # only checked here: replay adds it to the text it shows
        elif kind in ("step", "view"):
            return self._step(event)
        return None

    def _request(self, index: int) -> WaitingView:
        try:
            return self._requests[index]
        except KeyError:
            raise ValueError(f"request index {index} has no arrival event") from None

    def _step(self, e: dict) -> StepSnapshot:
        if "kv" in e:
            self._owners = expand(e["kv"], self.max_blocks)
        if "kv_refs" in e:
            self._refs = expand(e["kv_refs"], self.max_blocks)
        slots = []
        phases = settled_phases(e["slots"], {f.index for f in self._pending["finished"]}, e["mode"])
        for i, (cell, phase) in enumerate(zip(e["slots"], phases)):
            if cell == 0:
                slots.append(SlotView(i, Phase.EMPTY))
                continue
            index, _, *values = cell
            r = self._request(index)
            slots.append(SlotView(slot=i, phase=phase, index=index, **{n: getattr(r, n) for n in REQUEST_FIELDS},
                                  **cell_fields(values)))
        waiting = [replace(self._request(index), num_preemptions=preemptions)
                   for index, preemptions in zip(e["waiting"][::2], e["waiting"][1::2])]
        fields = {f.name: f.read(e) for f in STEP_NAMED}
        for pack in PACKS:
            fields.update(pack.read(e))
        wait = e.get("wait")
        cost = COST.decode(e["cost"])
        decode_cost = COST.decode(e["decode_cost"]) if "decode_cost" in e else _all_or_no_decode(fields, cost)
        pending, self._pending = self._pending, {"arrived": [], "rejected": [], "finished": [], "controls": []}
        return StepSnapshot(
            **fields, slots=tuple(slots), block_owners=self._owners, block_refs=self._refs, waiting=tuple(waiting),
            wait_reason=WaitReason(WaitKind(wait[0]), wait[1], wait[2]) if wait else None,
            counters=COUNTERS.decode(e["counters"]), cost=cost, decode_cost=decode_cost,
            finished=tuple(pending["finished"]), rejected=tuple(pending["rejected"]), arrived=tuple(pending["arrived"]),
            controls=tuple(pending["controls"]))


def _all_or_no_decode(n: dict, cost: StepCost) -> StepCost:
    """A step without decode_cost: every row decodes, or none does (in a file from before the field, a
    mixed step's is lost)."""
    decodes = n["num_decode_tokens"] + n["num_padding_tokens"]
    return cost if decodes and not n["num_prefill_tokens"] and not n["num_prompt_padding_tokens"] else StepCost()
