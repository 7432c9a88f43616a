"""Where a live server sits on the roofline, per interval (a RooflinePoint of core_engine/perf).

Measured: vLLM's own counters, intensity = delta(estimated_flops) / delta(estimated_read_bytes) and
achieved FLOP/s = delta(estimated_flops) / dt (vLLM fills them only with --enable-mfu-metrics;
batchtop serve always does). Estimated, when they are missing and the user names the model: the
interval's average step rebuilt from the token rates (decode rows per step, prefill tokens per step,
context from the mean request lengths) and priced by the same step_cost() the engine's Roofline
panel uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchtop.core_engine.attach.scrape.histogram import Histogram
from batchtop.core_engine.attach.window import Delta
from batchtop.core_engine.config import ModelConfig
from batchtop.core_engine.perf.roofline_point import RooflinePoint, believable
from batchtop.core_engine.model.cost import Chunk, step_cost

MFU_HINT = "vLLM fills estimated_flops/read_bytes only with --enable-mfu-metrics"


@dataclass(frozen=True, slots=True)
class ModelEstimate:
    """What the estimate needs besides the rates: the model's dims and the served dtype."""

    model: ModelConfig
    dtype: str


def measured_point(d: Delta) -> tuple[RooflinePoint | None, str | None]:
    """The point from the server's own FLOP and byte counters, or why there is none."""
    if "flops" not in d.totals or "read_bytes" not in d.totals:
        return None, "the server exposes no FLOP/byte counters"
    flops, nbytes = d.totals["flops"], d.totals["read_bytes"]
    if flops <= 0 or nbytes <= 0:
        if d.totals.get("generation_tokens", 0) > 0 or d.totals.get("prompt_tokens", 0) > 0:
            return None, f"FLOP/byte counters stay 0 ({MFU_HINT})"
        return None, "idle: no step in this interval"
    point = RooflinePoint(flops / nbytes, d.per_s["flops"], "measured")
    if not believable(point):
        return None, f"FLOP/byte counters beyond any real server ({point.intensity:.3g} FLOP/B, " \
                     f"{point.flops_per_s:.3g} FLOP/s)"
    return point, None


def _mean(hist: Histogram | None, fallback: float) -> float:
    return hist.mean if hist is not None and hist.mean is not None else fallback


def estimated_point(d: Delta, estimate: ModelEstimate, running: float | None,
                    lengths: dict[str, Histogram] | None = None) -> RooflinePoint | None:
    """The interval's mean step priced by step_cost(); None when no token moved."""
    gen, prompt = d.totals.get("generation_tokens", 0.0), d.totals.get("prompt_tokens", 0.0)
    if gen <= 0 and prompt <= 0:
        return None
    steps_hist = d.histograms.get("iteration_tokens")
    steps = steps_hist.count if steps_hist is not None and steps_hist.count > 0 else gen / max(running or 1.0, 1.0)
    steps = max(steps, 1.0)
    rows = max(1, round(gen / steps))
    prefill = round(prompt / steps)
    lengths = lengths or {}
    prompt_mean = _mean(lengths.get("prompt_len"), prompt / max(rows, 1) if prompt else 0.0)
    context = int(prompt_mean + _mean(lengths.get("generation_len"), 0.0) / 2)
    chunks = [Chunk(context, 1)] * rows + ([Chunk(0, prefill)] if prefill > 0 else [])
    cost = step_cost(estimate.model, estimate.dtype, chunks, rows + (1 if prefill > 0 else 0))
    point = RooflinePoint(cost.flops / cost.bytes, cost.flops * steps / d.dt, "estimated")
    return point if believable(point) else None
