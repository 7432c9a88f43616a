"""A client that sends its requests in batches and waits for each whole batch before sending the next
(static batching by accident), told from the requests in flight (running + waiting) and the finished
ones over the whole watch:

  burst    requests arrive together: at least BURST_MIN within ARRIVAL scrapes of a drained server
           (scrapes in which nothing moved do not count: a server that updates its gauges once per
           engine step shows nothing new while a long step runs, batchtop serve on a busy CPU among them)
  barrier  after its arrival nothing more arrives (each finish lowers the in-flight count by one; no
           new request takes its place) until it drains: nothing waits and at most a quarter of the
           burst (or one request) still runs. One request more for one scrape is forgiven (a gauge
           read a moment apart from its counter); two, or one that stays, is an arrival
  next     the next burst comes when the last request of the one before has finished (none carried
           over) and at once: nothing in flight for no more than a tenth of the time between them

Arrivals per interval are the change in flight plus the requests that finished in it (where the server
counts them; else only rises show). A client that keeps N in flight replaces each finish at once: its
arrivals never stop, so it makes no barrier, however flat its count looks. Requests that come in
clumps at random times fail the "next" rule: a clump lands on requests still running, or after a gap.
A trickle makes no burst, and any arrival that is not a burst breaks the chain.

Kept as the scrapes come, not from the history the strip charts draw: one batch on a slow CPU server
can outlast that history, and the reading is about the last few batches, however long they took.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchtop.core_engine.attach.history import HistoryPoint

BURST_MIN = 4  # requests that arrive together: fewer is a trickle
ARRIVAL = 2  # scrapes a burst may take to arrive (it can straddle a scrape)
DRAINED = 0.25  # of the last burst, or 1 request: what may still run when a batch has "drained"
IDLE_SHARE = 0.1  # of the time from one burst to the next: the most nothing may be in flight between
MIN_BURSTS = 3  # a burst, then two that each came when the one before had finished: a pattern
MIN_AT_END = 2  # at the end of a watch, two whole cycles (the newest drained too) are all a short one shows
MIN_SCRAPES = 5  # from one burst to the next: a shorter cycle is within the scrapes' own graininess
KEPT = 16


@dataclass(slots=True)
class Burst:
    start_t: float
    size: float  # requests that arrived in it
    scrape: int = 0  # the fresh scrape it arrived in, counted from the watch's first
    carried: float = 0.0  # requests from before still in flight when it arrived
    idle_s: float = 0.0  # seconds nothing was in flight just before it arrived
    real: bool = True  # False: arrivals that were no burst (a trickle), kept to break the chain
    clean: bool = True  # nothing else arrived while it ran
    arriving: int = 1  # scrapes of its arrival seen so far
    strays: float = 0.0  # requests that arrived after its arrival (signed: read skew cancels)
    drained_t: float | None = None
    drained_to: float | None = None  # the least running after it drained, before the next burst
    partial: bool = False  # running when the watch began: its arrival (and true start) unseen

    def follows(self, before: Burst) -> bool:
        """Whether it came when `before` had finished, and at once, `before` having run long enough
        to tell its drain from the scrapes' own graininess (a partial one ran longer than seen)."""
        gap = self.start_t - before.start_t
        return self.carried < 1 and self.idle_s <= IDLE_SHARE * gap and \
            (before.partial or self.scrape - before.scrape >= MIN_SCRAPES)


@dataclass(frozen=True, slots=True)
class BarrierReading:
    bursts: int  # in a row, each drained before the next
    size: float  # their mean size
    period_s: float  # mean time from one burst's arrival to the next
    drained_to: float  # the most still running at the low point between one burst and the next

    def as_dict(self) -> dict:
        return {"bursts": self.bursts, "burst_size": self.size, "period_s": self.period_s,
                "drained_to": self.drained_to}


class BurstWatch:
    def __init__(self) -> None:
        self.bursts: list[Burst] = []
        self._t: float | None = None  # the newest point taken
        self._scrapes = 0  # points taken
        self._in_flight: float | None = None
        self._drained = False
        self._pending: Burst | None = None  # arrivals after a drain, not BURST_MIN yet
        self._empty_from: float | None = None  # the first of the newest scrapes with nothing in flight

    def _low(self, p: HistoryPoint) -> bool:
        last = next((b for b in reversed(self.bursts) if b.real), None)
        limit = max(1.0, DRAINED * last.size) if last is not None else 1.0
        return not (p.waiting or 0) and (p.running or 0) <= limit

    def see(self, p: HistoryPoint) -> None:
        """Take one tick's point (each at most once; ticks without a fresh scrape are skipped, but the
        very first scrape, which has no interval yet, says what was in flight when the watch began)."""
        first = self._in_flight is None and p.running is not None
        if not first and (p.dt is None or p.running is None or (self._t is not None and p.t <= self._t)):
            return
        t_before, self._t = self._t, p.t
        self._scrapes += 1
        in_flight = (p.running or 0.0) + (p.waiting or 0.0)
        before, self._in_flight = self._in_flight, in_flight
        if before is not None:
            # without a finished count a fall says nothing (finishes, or finishes and arrivals): rises only
            rise = in_flight - before
            moved = rise != 0 or bool(p.finished) or any(v > 0 for v in p.totals.values())
            self._arrive(p, rise + p.finished if p.finished is not None else max(0.0, rise), moved, before, t_before)
            current = self.bursts[-1] if self.bursts else None
            if current is not None and current.real and current.drained_t is not None:
                current.drained_to = min(current.drained_to, p.running or 0.0)  # how low before the next
            if self._low(p) and current is not None and current.real and current.drained_t is None \
                    and self._pending is None:
                current.drained_t, current.drained_to = p.t, p.running or 0.0
        elif in_flight >= BURST_MIN:  # a batch already running: it counts once it is seen to drain
            self._keep(Burst(p.t, in_flight, self._scrapes, arriving=ARRIVAL, partial=True))
        if self._pending is None and self._low(p):
            self._drained = True  # (while arrivals are pending, the burst they make has not drained)
        self._empty_from = (self._empty_from if self._empty_from is not None else p.t) if in_flight <= 0 else None

    def _arrive(self, p: HistoryPoint, arrived: float, moved: bool, before: float, t_before: float) -> None:
        current = self.bursts[-1] if self.bursts else None
        if self._pending is not None:  # a drained server took its first arrivals a scrape ago
            self._pending.size += arrived
            self._pending.arriving += moved
            self._settle()
        elif current is not None and current.real and current.drained_t is None and current.arriving < ARRIVAL:
            current.size += arrived  # the burst is still arriving
            current.arriving += moved
        elif arrived >= 1 and self._drained:
            self._drained = False
            carried = max(0.0, before - p.finished) if p.finished is not None else 0.0
            idle = t_before - self._empty_from if self._empty_from is not None else 0.0
            self._pending = Burst(p.t, arrived, self._scrapes, carried=carried, idle_s=idle)
            self._settle()
        elif current is not None and current.drained_t is None:
            was, current.strays = current.strays, current.strays + arrived
            if current.strays >= 2 or (current.strays >= 1 and was >= 1):
                current.clean = False  # requests arrive while others run: no barrier

    def _settle(self) -> None:
        """A pending arrival becomes a burst once BURST_MIN arrived, or a trickle once ARRIVAL ran out."""
        pending = self._pending
        if pending.size >= BURST_MIN:
            self._keep(pending)
        elif pending.arriving >= ARRIVAL:
            pending.real = pending.clean = False
            self._keep(pending)

    def _keep(self, burst: Burst) -> None:
        self._pending = None
        self.bursts.append(burst)
        del self.bursts[:-KEPT]

    def reading(self, *, watch_ended: bool = False) -> BarrierReading | None:
        """The barrier pattern when the newest bursts show it: MIN_BURSTS or more in a row, each clean,
        drained before the next and followed by it at once (the newest may still be running). While the
        watch goes on, one batch after another once is no pattern yet (a third may not come); once it has
        ended, MIN_AT_END whole batches, the newest drained too, are the whole of what it saw. Arrivals
        pending for a scrape do not count yet, either way."""
        chain: list[Burst] = []
        for b in reversed(self.bursts):
            if not (b.real and b.clean and (not chain or (b.drained_t is not None and chain[-1].follows(b)))):
                break
            chain.append(b)
        whole = watch_ended and bool(chain) and chain[0].drained_t is not None
        if len(chain) < (MIN_AT_END if whole else MIN_BURSTS):
            return None
        chain.reverse()
        drained = [b.drained_to for b in chain[:-1] if b.drained_to is not None]
        seen = [b for b in chain if not b.partial]  # a partial one's size and start are only what was seen
        return BarrierReading(len(chain), sum(b.size for b in seen) / len(seen),
                              (seen[-1].start_t - seen[0].start_t) / (len(seen) - 1), max(drained, default=0.0))
