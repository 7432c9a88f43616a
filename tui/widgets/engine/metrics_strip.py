"""The metrics strip: throughput now with its sparkline, batch size per step, latency and the average
utilisation since the start (labelled "avg:", as the panels' titles count the newest step)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, Sparkline

from batchtop.core_engine.run.frame import DashboardFrame, LiveMetrics


def ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1e3:.0f}"


class MetricsStrip(Horizontal):
    """Two sparklines with their labels, and a block of numbers."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: DashboardFrame | None = None
        self._parts: tuple | None = None  # set once the children are mounted

    def compose(self) -> ComposeResult:
        yield Label("tok/s", id="tok-label", classes="spark-label")
        yield Sparkline([], id="tok-spark", summary_function=max)
        yield Label("batch", id="batch-label", classes="spark-label")
        yield Sparkline([], id="batch-spark", summary_function=max)
        yield Label("", id="numbers")

    def on_mount(self) -> None:
        self._parts = tuple(self.query_one(f"#{name}") for name in
                            ("tok-label", "tok-spark", "batch-label", "batch-spark", "numbers"))

    def show(self, frame: DashboardFrame) -> None:
        if self._parts is None or frame is self._shown:
            return
        self._shown = frame
        tok_label, tok_spark, batch_label, batch_spark, numbers_label = self._parts
        # Fixed-size labels: update without a layout pass (a relayout per frame costs the engine)
        m = frame.metrics
        # the label is 11 cells wide: a rate past 99999 is shown in thousands
        rate = f"{m.tok_s_now:>5.0f}" if m.tok_s_now < 99999.5 else f"{m.tok_s_now / 1e3:>4.0f}k"
        tok_label.update(f"tok/s {rate}", layout=False)
        # the leading 0 pins the scale's floor: bars read as amounts; no history yet draws no bars at all
        # (a lone 0 would fill the sparkline, as if at its peak)
        tok_spark.data = [0.0, *m.tok_s_history] if m.tok_s_history else []
        batch_now = frame.snapshot.num_seqs if frame.snapshot is not None else 0
        batch_label.update(f"batch {batch_now:>5d}", layout=False)
        batch_spark.data = [0.0, *m.batch_history] if m.batch_history else []
        numbers_label.update(numbers(m), layout=False)


def numbers(m: LiveMetrics) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"TTFT p50/p99 {ms(m.ttft_p50)}/{ms(m.ttft_p99)} ms  ")
    text.append(f"TPOT {ms(m.tpot_p50)}/{ms(m.tpot_p99)} ms\n")
    # averages since the start, labelled so: the Slots and KV titles beside them count this step
    text.append(f"avg: slots {100 * m.slot_utilization:.0f}% KV {100 * m.kv_utilization:.0f}%  ")
    text.append(f"preempt {m.preemptions}  done {m.completed}/{m.total}")
    if m.rejected:
        text.append(f"  rejected {m.rejected}")
    return text
