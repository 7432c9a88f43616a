"""StepSnapshot <-> compact JSON events, for the batchtop.trace format.

A snapshot becomes, in order: its control events, its arrivals, its rejections, its finished requests,
then one "step" event when a forward ran, or a "view" event (the same fields, step 0) when something
happened between steps: a replay then ends at the same run time and counters as the live run did.
Requests are named by their index; the arrival event carries the id and lengths once. Block
ownership ("kv") and, with prefix caching, holders per block ("kv_refs") are run-length encoded and
omitted when unchanged.

A slot's phase is its state once the step is over ("f": released in it, its KV freed). A trace from
before that field records what the slot did in the step instead; it is read into the same model
(see `settled_phases`), so an old recording replays as a new one shows.
"""

from __future__ import annotations

from batchtop.core_engine.sched.request import Phase
from batchtop.core_engine.sched.wait_reason import WaitKind, WaitReason
from batchtop.core_engine.engine.detokenizer import TextDelta
from batchtop.core_engine.engine.snapshot import Counters, FinishedRequest, SlotView, StepSnapshot, WaitingView
from batchtop.core_engine.model.cost import StepCost

PHASE_CODE = {Phase.PREFILL: "p", Phase.DECODE: "d", Phase.PADDING: "x", Phase.IDLE: "i", Phase.FINISHED: "f"}
CODE_PHASE = {v: k for k, v in PHASE_CODE.items()}
COUNTER_FIELDS = Counters.__slots__
COST_FIELDS = StepCost.__slots__
FINISH_FIELDS = FinishedRequest.__slots__


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
        out += [{"type": "arrival", "index": a.index, "id": a.request_id, "prompt_len": a.prompt_len,
                 "max_tokens": a.max_tokens, "arrival_s": a.arrival_s} for a in snap.arrived]
        out += [{"type": "reject", "id": rid, "reason": reason} for rid, reason in snap.rejected]
        fields = FINISH_FIELDS if self.record_text else tuple(k for k in FINISH_FIELDS if k != "output_token_ids")
        out += [{"type": "finish", **{k: getattr(f, k) for k in fields}} for f in snap.finished]
        if self.record_text and text:
            out.append(text.as_event())
        if snap.is_step or out:
            out.append(self._step(snap))
        return out

    def _step(self, snap: StepSnapshot) -> dict:
        event = {
            "type": "step" if snap.is_step else "view", "step": snap.step, "run_t": snap.t, "mode": snap.mode,
            "max_num_seqs": snap.max_num_seqs, "max_num_batched_tokens": snap.max_num_batched_tokens,
            "times": [snap.step_time_s, snap.schedule_s, snap.prepare_s, snap.forward_s],
            "tokens": [snap.num_prefill_tokens, snap.num_decode_tokens, snap.num_padding_tokens, snap.num_seqs,
                       snap.num_prompt_padding_tokens],
            "slots": [0 if s.phase is Phase.EMPTY else _slot_cell(s) for s in snap.slots],
            "free_blocks": snap.num_free_blocks,
            "waiting": [x for w in snap.waiting for x in (w.index, w.num_preemptions)],
            "num_waiting": snap.num_waiting, "pending": snap.num_pending_arrivals,
            "admitted": list(snap.admitted), "preempted": list(snap.preempted),
            "counters": [getattr(snap.counters, k) for k in COUNTER_FIELDS],
            "cost": [getattr(snap.cost, k) for k in COST_FIELDS],
        }
        if snap.num_prefill_tokens and snap.decode_cost.bytes > 0:  # decode rows beside a prompt chunk
            event["decode_cost"] = [getattr(snap.decode_cost, k) for k in COST_FIELDS]
        if snap.arrival_speed is not None:  # closed-loop pacing: the pace this step's arrivals came at
            event["pace"] = snap.arrival_speed
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
    if mode != "static":
        return [Phase.FINISHED if i in ended else p for i, p in enumerate(phases)]
    batch_over = all(p in (Phase.EMPTY, Phase.PADDING, Phase.FINISHED) or i in ended for i, p in enumerate(phases))
    if batch_over:
        return [Phase.EMPTY if p is Phase.EMPTY else Phase.FINISHED for p in phases]
    return [Phase.PADDING if i in ended else p for i, p in enumerate(phases)]


def _slot_cell(s: SlotView) -> list:
    """[index, phase, computed, generated], then prompt padding, then cached tokens, each when not 0."""
    cell = [s.index, PHASE_CODE[s.phase], s.num_computed, s.num_generated]
    if s.num_prompt_padding or s.num_cached:
        cell.append(s.num_prompt_padding)
    if s.num_cached:
        cell.append(s.num_cached)
    return cell


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
            view = WaitingView(event["id"], event["index"], event["prompt_len"], event["max_tokens"],
                               event["arrival_s"], 0)
            self._requests[view.index] = view
            self._pending["arrived"].append(view)
        elif kind == "reject":
            self._pending["rejected"].append((event["id"], event["reason"]))
        elif kind == "finish":
            fields = {k: event[k] for k in FINISH_FIELDS if k != "output_token_ids"}
            fields["output_token_ids"] = tuple(event.get("output_token_ids", ()))  # recorded with --record-text
            self._pending["finished"].append(FinishedRequest(**fields))
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
            index, code, computed, generated, *extra = cell
            pad, cached = (extra + [0, 0])[:2]
            r = self._request(index)
            slots.append(SlotView(i, phase, r.request_id, index, r.prompt_len, computed, generated,
                                  r.max_tokens, pad, cached))
        waiting = []
        for index, preemptions in zip(e["waiting"][::2], e["waiting"][1::2]):
            r = self._request(index)
            waiting.append(WaitingView(r.request_id, index, r.prompt_len, r.max_tokens, r.arrival_s, preemptions))
        step_time, schedule_s, prepare_s, forward_s = e["times"]
        prefill, decode, padding, num_seqs, *prompt_padding = e["tokens"]
        prompt_padding = prompt_padding[0] if prompt_padding else 0
        wait = e.get("wait")
        cost = StepCost(*e["cost"])
        if "decode_cost" in e:
            decode_cost = StepCost(*e["decode_cost"])
        else:  # every row decodes, or none does (a file from before the field: a mixed step's is lost)
            decode_cost = cost if decode + padding and not prefill and not prompt_padding else StepCost()
        pending, self._pending = self._pending, {"arrived": [], "rejected": [], "finished": [], "controls": []}
        return StepSnapshot(
            step=e["step"], t=e["run_t"], mode=e["mode"], max_num_seqs=e["max_num_seqs"],
            max_num_batched_tokens=e["max_num_batched_tokens"], step_time_s=step_time, schedule_s=schedule_s,
            prepare_s=prepare_s, forward_s=forward_s, num_prefill_tokens=prefill, num_decode_tokens=decode,
            num_padding_tokens=padding, num_prompt_padding_tokens=prompt_padding,
            num_seqs=num_seqs, slots=tuple(slots), block_owners=self._owners, block_refs=self._refs,
            num_free_blocks=e["free_blocks"], waiting=tuple(waiting), num_waiting=e["num_waiting"],
            wait_reason=WaitReason(WaitKind(wait[0]), wait[1], wait[2]) if wait else None,
            num_pending_arrivals=e["pending"], finished=tuple(pending["finished"]),
            admitted=tuple(e["admitted"]), preempted=tuple(e["preempted"]), rejected=tuple(pending["rejected"]),
            counters=Counters(*e["counters"]), cost=cost, decode_cost=decode_cost, arrived=tuple(pending["arrived"]),
            controls=tuple(pending["controls"]), arrival_speed=e.get("pace"))

