"""The attach metrics strip: token rates and batch tokens per step over the newest interval, latency
percentiles from the histogram buckets of the window, the finished requests by reason, and what the
server leaves empty: the monitor's numbers and readings, laid out."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from batchtop.core_engine.attach.monitor import AttachFrame
from batchtop.core_engine.attach.stats import ReplicaStats
from batchtop.core_engine.attach.streams.step_log import StepLogView
from batchtop.tui.widgets.attach.format import MEASURED_NOTE, latency, num, secs

GAPS_SHOWN = ("tokens", "ttft", "steps", "finished")  # the strip's; the panels say the rest
LATENCY_LABELS = (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "e2e"), ("queue_time", "queue"))


def metrics_text(s: ReplicaStats, steps: StepLogView | None = None) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    r = s.rates
    text.append(f" prompt {num(r.get('prompt_tokens'))} tok/s", "bold")
    text.append(f" · gen {num(r.get('generation_tokens'))} tok/s", "bold")
    if steps is not None:  # every step the server logged, not the scrapes' histogram
        busy = f", busy {100 * steps.busy_share:.0f}%" if steps.busy_share is not None else ""
        text.append(f" · {num(steps.steps_per_s, '{:.1f}')} steps/s (logged{busy})", "bold")
    else:
        text.append(f" · {num(s.tokens_per_step, '{:.1f}')} tok/step · {num(r.get('steps'), '{:.1f}')} steps/s")
    done = sum(s.finished.values())
    reasons = ", ".join(f"{k} {v:.0f}" for k, v in sorted(s.finished.items()) if v > 0)
    rate = "–" if s.success_rate is None else f"{100 * s.success_rate:.0f}%"
    text.append(f" · finished {done:.0f} ({reasons or 'none'}), success {rate}\n")
    window = f"{s.window_s:.0f}s" if s.window_s else "–"
    text.append(f" p50/p99 over {window}: ")
    text.append("  ".join(f"{label} {secs(latency(s, key, 'p50'))}/{secs(latency(s, key, 'p99'))}"
                          for key, label in LATENCY_LABELS))
    text.append(f"   ({MEASURED_NOTE})", "dim")
    text.append(f"\n prefix cache: {s.prefix_cache}")
    notes = [s.cannot_fill[what] for what in GAPS_SHOWN if what in s.cannot_fill]
    if notes:
        text.append(" · " + "; ".join(notes), "dim")
    return text


class AttachMetricsStrip(Static):
    def show(self, frame: AttachFrame) -> None:
        self.update(metrics_text(frame.main, frame.streams.steps if frame.streams is not None else None))
