"""`--export-workload FILE`: the traffic a live server saw, as a batchtop workload (JSON Lines) that
`batchtop compare --simulate DEVICE --workload FILE` then runs on other hardware and knobs.

Each line's prompt_len comes from the prompt-length histogram (vLLM's request_prompt_tokens), its
max_tokens from the output-length one (request_generation_tokens), both over the whole watch. Every
bucket gets its share of the lines (largest remainder), spread inside the bucket so the lines' mean
is the histogram's own (its _sum / _count): the file matches the server to within a bucket, and its
mean exactly, rounding aside. The histograms do not pair a prompt with its output, so the two are
drawn independently. Arrivals are a Poisson process at the rate requests reached the server: those
that finished (request_success_total) plus the change in those in flight, over the watch less its
quiet scrapes before the first request and after the last (session.py), with the n-th arrival at
n / rate. A `#` header says all of this in the file itself.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

from batchtop.core_engine.attach.coverage import gap
from batchtop.core_engine.attach.scrape.delta import Delta
from batchtop.core_engine.attach.scrape.histogram import Histogram
from batchtop.core_engine.attach.servers import label
from batchtop.core_engine.attach.watch_totals import SessionTotals, plus
from batchtop.core_engine.attach.verdict.verdict_span import step_buckets


class ExportError(ValueError):
    """The watch holds nothing to export (its own words say why)."""


@dataclass(frozen=True, slots=True)
class ExportedWorkload:
    header: list[str]
    lines: list[dict]
    rate: float  # requests per second
    prompt_mean: float  # the histograms' own means
    output_mean: float

    def text(self) -> str:
        return "".join(f"# {h}\n" for h in self.header) + "".join(json.dumps(line) + "\n" for line in self.lines)


def _shares(counts: list[float], n: int) -> list[int]:
    """n lines over the buckets in proportion to their observations (largest remainder)."""
    total = sum(counts)
    exact = [n * c / total for c in counts]
    out = [math.floor(x) for x in exact]
    for i in sorted(range(len(exact)), key=lambda i: exact[i] - out[i], reverse=True)[:n - sum(out)]:
        out[i] += 1
    return out


def _spread(low: int, high: int, k: int, f: float) -> list[int]:
    """k whole numbers in [low, high], evenly placed, their mean at the share f of the way up."""
    if k <= 0:
        return []
    if high <= low or f <= 0:
        return [low] * k
    if f >= 1:
        return [high] * k
    power = 1 / f - 1  # the mean of u**power over u in (0, 1) is f
    return [low + round((high - low) * ((j + 0.5) / k) ** power) for j in range(k)]


def _nudge(values: list[list[int]], target: int) -> None:
    """Move values one token at a time, each inside its bucket, until they sum to the target (or none
    can move): the rounding of _spread undone, so the mean is the histogram's to 1/n of a token."""
    diff = target - sum(v for v, _, _ in values)
    step = 1 if diff > 0 else -1
    moved = True
    while diff and moved:
        moved = False
        for item in values:
            if diff and item[1] <= item[0] + step <= item[2]:
                item[0] += step
                diff -= step
                moved = True


def _bucket_ranges(h: Histogram, n: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """(lowest, highest whole length, lines) of each finite bucket given lines, and (lowest, lines) of
    the one above the highest bound."""
    buckets = step_buckets(h)
    shares = _shares([c for _, _, c in buckets], n)
    finite = [(max(1, math.floor(lo) + 1), max(1, math.floor(hi)), k)
              for (lo, hi, _), k in zip(buckets, shares) if k and math.isfinite(hi)]
    tail = [(max(1, math.floor(lo) + 1), k) for (lo, hi, _), k in zip(buckets, shares) if k and not math.isfinite(hi)]
    return finite, tail


def sum_fits(h: Histogram) -> bool:
    """Whether the histogram's _sum / _count is a mean its buckets allow (every observation somewhere
    in its bucket, half a token of rounding either way). One that is not (a server that omits _sum, says
    NaN for it, or whose sum stopped moving) cannot be the lines' mean."""
    if h.count <= 0 or not math.isfinite(h.sum):
        return False
    finite, tail = _bucket_ranges(h, round(h.count))
    n = sum(k for *_, k in finite) + sum(k for _, k in tail)
    low = sum(a * k for a, _, k in finite) + sum(a * k for a, k in tail)
    high = math.inf if tail else sum(b * k for _, b, k in finite)
    return n > 0 and low / n - 0.5 <= h.sum / h.count <= high / n + 0.5


def draw_lengths(h: Histogram, n: int, rng: random.Random) -> list[int]:
    """n lengths (>= 1) distributed as the histogram's buckets, their mean the histogram's mean (or,
    where its _sum does not fit its buckets, each bucket's lines spread evenly across it)."""
    finite, tail = _bucket_ranges(h, n)
    fits = sum_fits(h)
    target = n * (h.sum / h.count) if fits else None
    low_sum, high_sum = sum(a * k for a, _, k in finite), sum(b * k for _, b, k in finite)
    if tail:  # above the highest bound: whatever the mean still needs, at least the bound itself
        values = [[v, a, b] for a, b, k in finite for v in _spread(a, b, k, 0.5)]
        lowest, k = tail[0]
        rest = lowest if target is None else max(lowest, round((target - sum(v for v, _, _ in values)) / k))
        values += [[rest, lowest, rest] for _ in range(k)]
    elif target is None:
        values = [[v, a, b] for a, b, k in finite for v in _spread(a, b, k, 0.5)]
    else:
        f = (target - low_sum) / (high_sum - low_sum) if high_sum > low_sum else 0.0
        values = [[v, a, b] for a, b, k in finite for v in _spread(a, b, k, min(1.0, max(0.0, f)))]
        _nudge(values, round(target))
    out = [v for v, _, _ in values]
    rng.shuffle(out)
    return out


def poisson_arrivals(n: int, rate: float, rng: random.Random) -> list[float]:
    gaps = [rng.expovariate(1.0) for _ in range(n)]
    scale = (n / rate) / sum(gaps)  # the n-th arrival at n / rate: the file's rate is the server's
    out, t = [], 0.0
    for g in gaps:
        t += g * scale
        out.append(round(t, 6))
    return out


def merged(sessions: list[SessionTotals]) -> tuple[Delta | None, float]:
    """Every replica's session summed (the longest one's seconds), and the change in requests in flight."""
    deltas = [s.delta for s in sessions if s.delta is not None]
    total: Delta | None = None
    for d in deltas:
        total = d if total is None else plus(total, d)
    if total is not None:
        total = Delta(max(d.dt for d in deltas), total.totals, total.per_s, total.histograms, total.success)
    in_flight = sum((s.last_in_flight or 0.0) - (s.first_in_flight or 0.0) for s in sessions)
    return total, in_flight


def build_workload(sessions: list[SessionTotals], urls: list[str], flavour: str | None, seed: int = 0) -> ExportedWorkload:
    for url, s in zip(urls, sessions):
        if s.not_one_server:
            raise ExportError(f"{url}: {s.not_one_server}: its counters are not one server's traffic")
    total, in_flight = merged(sessions)
    if total is None or total.dt <= 0:
        raise ExportError("the watch saw no two scrapes of a live server in a row: nothing to measure")
    prompts, outputs = total.histograms.get("prompt_len"), total.histograms.get("generation_len")
    if prompts is None or outputs is None:
        raise ExportError(f"{gap(flavour, 'lengths', f'{label(flavour)} exposes no per-request length histograms')}: "
                          "nothing to draw the lengths from")
    if prompts.count <= 0 or outputs.count <= 0:
        raise ExportError(f"no request finished in the {total.dt:.0f} s attach watched: nothing to draw the "
                          "lengths from (watch longer, under load)")
    finished = sum(total.success.values()) if total.success else prompts.count
    n = max(1, round(finished + in_flight))
    rate = n / total.dt
    rng = random.Random(seed)
    prompt_lens, output_lens = draw_lengths(prompts, n, rng), draw_lengths(outputs, n, rng)
    arrivals = poisson_arrivals(n, rate, rng)
    prompt_mean = prompts.mean if sum_fits(prompts) else sum(prompt_lens) / n
    output_mean = outputs.mean if sum_fits(outputs) else sum(output_lens) / n
    lines = [{"id": f"attach-{i}", "prompt_len": p, "max_tokens": m, "arrival_s": a}
             for i, (p, m, a) in enumerate(zip(prompt_lens, output_lens, arrivals))]
    where = ", ".join(urls)
    watched = max(s.watched_s for s in sessions)
    quiet = (f" of traffic (a {watched:.1f} s watch, less its quiet scrapes before the first request and "
             "after the last)") if watched > total.dt + 1e-9 else ""
    header = [
        f"batchtop attach --export-workload: {n} requests as {label(flavour)} at {where} saw them over "
        f"{total.dt:.1f} s{quiet}",
        f"arrivals: Poisson at {rate:.3f} requests/s = ({finished:.0f} finished (request_success_total) "
        f"{in_flight:+.0f} in flight) / {total.dt:.1f} s; the n-th arrival at n / rate",
        f"prompt_len: {prompts.count:.0f} prompts in the prompt-length histogram, {_mean_words(prompts)} "
        f"(these lines: {sum(prompt_lens) / n:.1f}); max_tokens: {outputs.count:.0f} outputs, "
        f"{_mean_words(outputs)} (these lines: {sum(output_lens) / n:.1f})",
        "each bucket gets its share of the lines, spread inside it; prompt and output lengths are drawn "
        f"independently (the histograms do not pair them); seed {seed}",
    ]
    return ExportedWorkload(header, lines, rate, prompt_mean, output_mean)


def _mean_words(h: Histogram) -> str:
    if sum_fits(h):
        return f"mean {h.mean:.1f}"
    return (f"its _sum ({h.sum:g}) not a mean its buckets allow: each bucket's lines spread evenly across it, "
            "the mean unknown")
