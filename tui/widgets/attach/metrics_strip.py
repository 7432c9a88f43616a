"""The attach metrics strip: token rates and batch tokens per step over the newest interval, latency
percentiles from the histogram buckets of the window, and the finished requests by reason."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from batchtop.core_engine.attach.coverage import GAPS
from batchtop.core_engine.attach.monitor import AttachFrame
from batchtop.core_engine.attach.stats import ReplicaStats
from batchtop.tui.widgets.attach.format import MEASURED_NOTE, latency, num, secs

LATENCY_LABELS = (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "e2e"), ("queue_time", "queue"))


def metrics_text(s: ReplicaStats) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    r = s.rates
    text.append(f" prompt {num(r.get('prompt_tokens'))} tok/s", "bold")
    text.append(f" · gen {num(r.get('generation_tokens'))} tok/s", "bold")
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
    text.append(f"\n prefix cache: {prefix_hit_rate(s)}")
    notes = [GAPS[what][s.flavour] for what in ("tokens", "ttft", "steps", "finished")
             if s.flavour in GAPS[what] and (what != "ttft" or "ttft" not in s.latency)]
    if notes:
        text.append(" · " + "; ".join(notes), "dim")
    return text


def prefix_hit_rate(s: ReplicaStats) -> str:
    """Tokens found cached / tokens looked up, over the window (vLLM's own counters)."""
    queries, hits = s.window_rates.get("prefix_queries"), s.window_rates.get("prefix_hits")
    if queries is None or hits is None:
        return "not exposed"
    if queries <= 0:
        return f"no lookups over {s.window_s:.0f}s" if s.window_s else "no lookups yet"
    return f"hit {100 * hits / queries:.0f}% of {queries * (s.window_s or 0):,.0f} prompt tokens over {s.window_s:.0f}s"


class AttachMetricsStrip(Static):
    def show(self, frame: AttachFrame) -> None:
        self.update(metrics_text(frame.main))
