"""The Waiting panel: the queue in order, how long each request has waited, and why the head waits
(the reason the scheduler published in the snapshot)."""

from __future__ import annotations

from rich.text import Text

from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.core_engine.run.arrival_pacing import TARGET_SLOT_UTILIZATION
from batchtop.core_engine.sched.policies import policy_class
from batchtop.core_engine.run.frame import DashboardFrame
from batchtop.tui.widgets.common.text_fit import first_fit, pad
from batchtop.tui.widgets.common.panel import Panel, Runs
from batchtop.tui.widgets.common.units import short_seconds


def pace_labels(snap: StepSnapshot) -> tuple[str, ...]:
    """How the arrivals play now, when a closed-loop pacer plays them (run.pacing): the whole label, then
    shorter ones for a narrow footer."""
    speed = snap.arrival_speed
    if speed is None:
        return ("",)
    if speed <= 0:
        return "first wave; paced from the first completions", "first wave, then paced", "first wave", "1st wave"
    target = f"~{100 * TARGET_SLOT_UTILIZATION:.0f}% busy"
    if not policy_class(snap.mode).admits_mid_batch:  # the pacer holds its pace (run.pacing)
        return f"pace held at {speed:.2g}x", f"pace {speed:.2g}x", f"{speed:.2g}x"
    return f"paced {speed:.2g}x for {target}", f"paced {speed:.2g}x", f"{speed:.2g}x"


def pace_label(snap: StepSnapshot) -> str:
    return pace_labels(snap)[0]


def arrivals_label(workload: dict | None) -> str:
    """How the workload's arrivals are played, from its metrics/trace `workload` record."""
    scale = (workload or {}).get("time_scale")
    if scale is None or scale == 1:
        return ""
    if scale == 0:
        return "all arrived at once"
    speed = f"{1 / scale:.2g}x"
    return f"trace paced to {speed}" if (workload or {}).get("pace") else f"arrivals at {speed}"


class WaitingPanel(Panel):
    MODELLED = True  # waited times are simulated seconds

    def __init__(self, arrivals: str = "", *, id: str | None = "waiting") -> None:
        super().__init__(id=id)
        self.arrivals = arrivals  # how the arrivals are paced, for the subtitle

    def content_key(self, frame: DashboardFrame) -> object:
        snap = frame.snapshot
        if snap is None:
            return None
        head = tuple((w.request_id, w.num_preemptions) for w in snap.waiting[:40])
        # waited times are shown in whole seconds when narrow and tenths when wide: tenths it is
        return (head, snap.num_waiting, snap.num_pending_arrivals, round(snap.t, 1), snap.wait_reason,
                pace_label(snap))

    def update_titles(self, frame: DashboardFrame) -> None:
        snap = frame.snapshot
        n = snap.num_waiting if snap is not None else 0
        self.border_title = f"Waiting {n}"
        later = snap.num_pending_arrivals if snap is not None else 0
        arriving = (f"{later} to arrive", f"+{later}") if later else ("",)
        paces = pace_labels(snap) if snap is not None and snap.arrival_speed is not None else (self.arrivals,)
        # the footer is fitted, not cut by the border: the pace loses words first, then the count shortens
        options = [" · ".join(p for p in (a, pace) if p) for a in arriving for pace in paces]
        options.sort(key=len, reverse=True)
        self.border_subtitle = first_fit(options, self.title_room())

    def render(self) -> Text:
        frame = self.frame
        if frame is None or frame.snapshot is None:
            return self.placeholder("no requests yet")
        snap = frame.snapshot
        if not snap.waiting:
            return self.placeholder("queue empty")
        width, height = self.content_size.width, self.content_size.height
        out = Runs()
        lines = 0
        if snap.wait_reason is not None:  # the scheduler's own reason: the panel only displays it
            reason = snap.wait_reason
            out.add(first_fit([reason.message, reason.short], width) + "\n", self.style("warning", bold=True))
            lines += 1
        wide = width >= 30
        header = f"{'request':<9}{'prompt':>7}{'max':>6}{'waited':>8}" if wide else f"{'req':<7}{'prompt':>6}{'wait':>5}"
        out.add(header, self.style("muted"))
        lines += 1
        room = max(0, height - lines)
        if snap.num_waiting > room:
            room = max(0, room - 1)  # the last row says how many are not listed
        for w in snap.waiting[:room]:
            out.newline()
            waited = max(0.0, snap.t - w.arrival_s)
            # a preempted request's ↺ count takes the end of its id's column, so a full-width row keeps it
            mark = f" ↺{w.num_preemptions}" if w.num_preemptions else ""
            out.add(pad(w.request_id, (9 if wide else 7) - len(mark), keep_end=True), self.request_style(w.index))
            if mark:
                out.add(mark, self.style("warning"))
            numbers = (f"{w.prompt_len:>7}{w.max_tokens:>6}{waited:>7.1f}s" if wide
                       else f"{w.prompt_len:>6}{short_seconds(waited, 5):>5}")
            out.add(numbers, self.style("foreground"))
        shown = min(room, len(snap.waiting))
        if snap.num_waiting > shown:  # no key lists the rest: the title counts them, the order is the policy's
            out.newline()
            hidden = snap.num_waiting - shown
            note = first_fit([f"… {hidden} more behind ({shown} of {snap.num_waiting} listed)", f"… +{hidden} more",
                              f"+{hidden}"], width)
            out.add(note, self.style("warning"))
        return out.text()
