"""What bounds the batch of a live server right now, from the signals its /metrics exposes over the
last seconds: the answer to "throughput is low and the GPU is not full: where do I look?".

  slots     running sits at its ceiling while requests wait and KV has room
  kv        the KV pool is near full while requests wait, or the server preempts
  budget    the steps' tokens pile in their top bucket (at the token budget) while prompts wait
  client    nothing waits and running stays below the ceiling: the load is too low, or it comes in
            batches that drain before the next arrives (static batching by accident; bursts.py), a
            batch that fills every slot included
  deferred  the waiting requests are deferred by the scheduler (vLLM's own reason), not short of room
  idle      nothing runs, nothing waits, no token moves
  unclear   requests wait, but no limit shows in the signals (or the batch is full and nothing waits yet)

Each verdict carries its evidence (the numbers it rests on) and one "try": the knob to turn, in the
server's own option names (its record in servers/, read through knobs.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batchtop.core_engine.attach.coverage import gap
from batchtop.core_engine.attach.knobs import knobs
from batchtop.core_engine.attach.verdict.verdict_span import Pattern, Span, share_at_budget, top_bucket

KINDS = ("slots", "kv", "budget", "client", "deferred", "idle", "unclear", "watching")
HEADLINES = {"slots": "SLOTS", "kv": "KV CACHE", "budget": "TOKEN BUDGET", "client": "CLIENT",
             "deferred": "DEFERRED", "idle": "IDLE", "unclear": "NO SINGLE BOUND", "watching": "WATCHING"}
MIN_SCRAPES = 3
WAITS = 0.5  # requests waited in at least half the scrapes
QUIET = 0.2  # ... in at most a fifth: nothing waits
KV_FULL = 0.90
AT_CEILING = 0.6
TOP_BUCKET = 0.5  # half the steps or more in the top bucket
MIN_STEPS = 5


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: str
    line: str  # what bounds the batch, and the numbers that say so
    advice: str | None  # "try: ..."
    evidence: dict[str, object] = field(default_factory=dict)
    since_s: float | None = None  # how long this verdict has held
    candidate: str | None = None  # what the newest scrapes point to, not confirmed yet

    @property
    def headline(self) -> str:
        return HEADLINES[self.kind]

    def as_dict(self) -> dict:
        return {"bound": self.kind, "line": self.line, "try": self.advice, "evidence": dict(self.evidence),
                "since_s": self.since_s, "candidate": self.candidate}


def _full_share(s: Span) -> tuple[float | None, str]:
    """How often the batch sat at the ceiling, and what that counts: every logged step where the server's
    log says (--vllm-log), else the scrapes."""
    if s.logged is not None and s.logged.idle_slot_share is not None:
        return 1.0 - s.logged.idle_slot_share, f"{s.logged.steps} logged steps"
    return s.at_ceiling_share, f"{s.scrapes} scrapes"


def _at_ceiling(s: Span) -> bool:
    share, _ = _full_share(s)
    return share is not None and share >= AT_CEILING


def _logged_budget(s: Span) -> tuple[float, float, float] | None:
    """The budget from the logged steps: the share that reach it, or, with no budget said, the share that
    hold exactly the span's largest step (a budget shows as a plateau no decode step reaches)."""
    steps = s.logged
    if s.budget and steps.at_budget_share is not None:
        share = steps.at_budget_share
        return (float(s.budget), float(s.budget), share) if share >= TOP_BUCKET else None
    top = steps.max_tokens
    if steps.at_max_share >= TOP_BUCKET and top >= max(8.0, 2 * steps.mean_rows):
        return float(top), float(top), steps.at_max_share
    return None


def _idle(s: Span) -> bool:
    moved = s.totals.get("generation_tokens", 0.0) + s.totals.get("prompt_tokens", 0.0)
    return s.running_max == 0 and s.waiting_max == 0 and moved == 0


def _preempting(s: Span) -> bool:
    return (s.preemptions or 0.0) > 0 or s.reasons.get("paused", 0.0) >= 1


def _budget_bound(s: Span) -> tuple[float, float, float] | None:
    """(lower, upper, share) of the bucket the steps pile in, when they pile at a budget."""
    if (s.kv_mean or 0.0) >= KV_FULL or (s.ceiling and s.running_mean >= s.ceiling):
        return None
    if s.logged is not None and s.logged.steps >= MIN_STEPS:
        return _logged_budget(s)
    if s.steps is None or s.steps.count < MIN_STEPS:
        return None
    if s.budget:
        share = share_at_budget(s.steps, s.budget)
        lower, upper = s.steps.bucket_of(s.budget)
        return (lower, upper, share) if share is not None and share >= TOP_BUCKET else None
    top = top_bucket(s.steps)
    if top is None or top[2] < TOP_BUCKET or top[0] < max(8.0, 2 * s.running_mean):
        return None  # a step of one token per running request is a decode step, not a full budget
    return top


def classify(s: Span | None, p: Pattern | None = None) -> str:
    if s is None or s.scrapes < MIN_SCRAPES:
        return "watching"
    if _idle(s):
        return "idle"
    waits = s.waiting_share >= WAITS
    deferred = s.reasons.get("deferred", 0.0)
    if waits and deferred >= 1 and deferred >= s.reasons.get("capacity", 0.0):
        return "deferred"
    if _preempting(s) or (waits and s.kv_mean is not None and s.kv_mean >= KV_FULL):
        return "kv"
    if waits and s.ceiling_source != "inferred" and _at_ceiling(s):
        return "slots"
    if waits and _budget_bound(s) is not None:
        return "budget"
    if waits and _at_ceiling(s):
        return "slots"
    if s.waiting_share <= QUIET and not _at_ceiling(s):
        return "client"
    if p is not None and p.barrier is not None and (s.waiting_share < WAITS or s.waiting_max <= p.barrier.size):
        return "client"  # a batch that fills the slots, or waits for steps to admit it: still batches
    return "unclear"


def _pct(share: float | None, flavour: str | None) -> str:
    return f"{100 * share:.0f}%" if share is not None else f"not exposed ({gap(flavour, 'kv')})"


def _ceiling_words(s: Span) -> str:
    if not s.ceiling:
        return f"unknown ({gap(s.flavour, 'ceiling', 'not exported')})"
    if s.ceiling_source == "inferred":
        return f"{s.ceiling}, inferred from the plateau ({gap(s.flavour, 'ceiling', 'not exported')})"
    return f"{s.ceiling} ({'from ' if s.ceiling_source.startswith('--') else ''}{s.ceiling_source})"


def _evidence(s: Span) -> dict[str, object]:
    return {"scrapes": s.scrapes, "seconds": round(s.seconds, 3), "running_mean": s.running_mean,
            "running_max": s.running_max, "waiting_mean": s.waiting_mean, "waiting_share": s.waiting_share,
            "waiting_by_reason": dict(s.reasons), "kv_mean": s.kv_mean, "kv_max": s.kv_max,
            "ceiling": s.ceiling, "ceiling_source": s.ceiling_source, "at_ceiling_share": s.at_ceiling_share,
            "token_budget": s.budget, "preemptions_per_s": s.rate("preemptions"),
            "finished_per_s": s.finished / s.seconds if s.finished is not None and s.seconds > 0 else None,
            "steps": s.steps.count if s.steps is not None else None,
            "step_log": s.logged.as_dict() if s.logged is not None else None}


def _recompute(s: Span) -> tuple[float | None, str]:
    """Tokens per second the preempted requests will compute again (vLLM recomputes them), estimated
    from the span's own tokens per finished request."""
    rate = s.rate("preemptions")
    if not rate or not s.finished:
        return None, ""
    context = (s.totals.get("prompt_tokens", 0.0) + s.totals.get("generation_tokens", 0.0) / 2) / s.finished
    tok_s = rate * context
    prompt_s = s.rate("prompt_tokens")
    share = f", {100 * tok_s / prompt_s:.0f}% of the prompt tok/s" if prompt_s else ""
    return tok_s, f" ≈ {tok_s:.0f} tok/s recomputed (est.{share})"


def explain(kind: str, s: Span | None, p: Pattern | None = None) -> Verdict:
    if s is None or kind == "watching":
        n = 0 if s is None else s.scrapes
        return Verdict("watching", f"watching: {n} scrape(s) with fresh numbers so far; the verdict needs "
                                   f"{MIN_SCRAPES} that agree", None, {} if s is None else _evidence(s))
    k, ev = knobs(s.flavour), _evidence(s)
    kv = _pct(s.kv_mean, s.flavour)
    wait = f"{s.waiting_mean:.0f} waiting" + (f" ({', '.join(f'{r} {v:.0f}' for r, v in sorted(s.reasons.items()) if v)})"
                                               if any(s.reasons.values()) else "")
    if kind == "slots":
        share, counted = _full_share(s)
        line = (f"slots: running at the ceiling of {_ceiling_words(s)} in {100 * (share or 0):.0f}% "
                f"of {counted} (mean {s.running_mean:.1f}), {wait}, KV {kv}")
        room = f": KV has room ({kv})" if s.kv_mean is not None else " (watch KV as you do: it is not exposed)"
        above = f" above {s.ceiling}" if s.ceiling else ""
        return Verdict(kind, line, f"try: raise {k.slots}{above}{room}, or add replicas", ev)
    if kind == "kv":
        tok_s, recompute = _recompute(s)
        preempt = s.rate("preemptions")
        paused = s.reasons.get("paused", 0.0)
        what = (f", {preempt:.2f} preemptions/s{recompute}" if preempt else "") + \
               (f", {paused:.0f} paused (preempted)" if paused >= 1 else "")
        peak = f" (peak {100 * s.kv_max:.0f}%)" if s.kv_max is not None else ""
        ev["recompute_tok_s"] = tok_s
        return Verdict(kind, f"KV cache: {kv} full{peak}, {wait}{what}",
                       f"try: more KV blocks ({k.kv}), or fewer sequences at once ({k.slots}) so fewer are "
                       "preempted and recomputed", ev)
    if kind == "budget":
        lower, upper, share = _budget_bound(s) or (0.0, 0.0, 0.0)
        logged = s.logged is not None and s.logged.steps >= MIN_STEPS
        budget = f"the budget of {s.budget}" if s.budget else \
            f"the {'largest step' if logged else 'top bucket'}: the budget, inferred"
        ceiling = f" of {s.ceiling}" if s.ceiling else ""
        ev.update(step_bucket=[lower, upper], step_bucket_share=share)
        counted = f"{s.logged.steps} logged steps" if logged else f"{s.steps.count:.0f} steps"
        held = f"{lower:.0f}" if lower == upper else f"{lower:.0f}-{upper:.0f}"
        return Verdict(kind, f"token budget: {100 * share:.0f}% of {counted} hold {held} tokens ({budget}) while "
                             f"{wait}; {s.running_mean:.0f} running{ceiling}, KV {kv}",
                       f"try: raise {k.budget}{f' above {s.budget}' if s.budget else ''}: each step admits "
                       "only that many prompt tokens", ev)
    if kind == "client":
        return _client(s, p, ev)
    if kind == "deferred":
        deferred = s.reasons.get("deferred", 0.0)
        return Verdict(kind, f"deferred: {deferred:.0f} of {s.waiting_mean:.0f} waiting requests are deferred by "
                             "the scheduler (a LoRA budget, a KV transfer, a blocked status), not short of room",
                       "try: raise --max-loras if they use LoRA adapters; else find what blocks them "
                       "(a remote KV transfer, a structured-output grammar)", ev)
    if kind == "idle":
        return Verdict(kind, f"idle: nothing running or waiting, no token in the last {s.seconds:.0f} s",
                       "try: send traffic: the verdict needs a load to judge", ev)
    if s.ceiling and _at_ceiling(s) and s.waiting_share < WAITS:
        return Verdict(kind, f"full, nothing waits yet: {s.running_mean:.0f} of {_ceiling_words(s)} running, "
                             f"requests waited in {100 * s.waiting_share:.0f}% of {s.scrapes} scrapes",
                       f"try: raise {k.slots} before the load grows: one more request would wait", ev)
    free = f"{s.ceiling - s.running_mean:.0f} of {s.ceiling} slots free" if s.ceiling else "the slot ceiling unknown"
    return Verdict(kind, f"no single bound: {wait} in {100 * s.waiting_share:.0f}% of {s.scrapes} scrapes with "
                         f"{free}, KV {kv}, steps not at a budget",
                   "try: give --max-num-seqs so the ceiling is known" if not s.ceiling
                   else "try: watch a longer --window: the queue comes and goes", ev)


def _client(s: Span, p: Pattern | None, ev: dict[str, object]) -> Verdict:
    of = f" of {s.ceiling} slots" if s.ceiling else ""
    ev["completions_in_busiest_quarter"] = p.burst_share if p is not None else None
    if p is not None and p.barrier is not None:
        b = p.barrier
        ev.update(pattern="barrier", peak=p.peak, **b.as_dict())
        every = f", one every {b.period_s:.{0 if b.period_s >= 10 else 1}f} s"
        return Verdict("client", f"client (batches): {b.bursts} bursts of ~{b.size:.0f}{of} that "
                                 f"drain before the next (to {b.drained_to:.0f} running{every}): the client waits "
                                 "for each batch",
                       "try: send requests as they come, a new one as each finishes (examples/in_flight_client.py), "
                       "not in batches: each batch waits for its slowest request (static batching by accident)", ev)
    finished = ev.get("finished_per_s")
    rate = f", {finished:.2f} requests/s finish" if isinstance(finished, float) else ""
    peak = p.peak if p is not None else s.running_max
    ev.update(pattern="low rate", peak=peak)
    fewer = f", or serve it with fewer than {s.ceiling} slots" if s.ceiling else ""
    return Verdict("client", f"client (low load): nothing waits; {s.running_mean:.1f} running on average (peak "
                             f"{peak:.0f}){of}{rate}: the load is too low to fill the batch",
                   f"try: send more requests at once (the client's concurrency or rate){fewer}", ev)
