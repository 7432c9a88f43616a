"""`batchtop compare`: one workload under the registry's baseline policy (static batching) then the one measured
against it (continuous batching), side by side; the JSON keys are the two mode names."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.perf.roofline import bound
from batchtop.core_engine.sched.policies import COMPARE_BASELINE, COMPARE_CANDIDATE, policy_class
from batchtop.tui.cli.headless import (build_engine, exit_code, load_peaks, metrics_document, note_raised,
                                           note_written, run_and_report, run_roofs)
from batchtop.tui.cli.defaults import COMPARE_REQUESTS
from batchtop.tui.cli.options import EXIT_ENGINE_FAILURE, bad_input_exits
from batchtop.tui.cli.run_setup import build_setup
from batchtop.core_engine.output_files import deliver_json

COMPARE_SCHEMA = "batchtop.compare/1"


def _ms(stat: dict) -> str:
    p50, p99 = stat.get("p50"), stat.get("p99")
    return "-" if p50 is None else f"{p50 * 1e3:.0f} / {p99 * 1e3:.0f}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _decode_point(m: dict) -> str:
    """Where the mean decode step sits against the ridge: left of it, one more sequence is nearly free."""
    roof, decode = m["roofline"], m["roofline"]["decode"]
    if decode["intensity_mean"] is None:
        return "-"
    return f"{decode['intensity_mean']:.1f} {bound(decode['intensity_mean'], roof['ridge_flop_per_byte'])}"


def speedup_of(baseline: dict, candidate: dict) -> tuple[float | None, str]:
    """The candidate's throughput over the baseline's, and the words for it; None when the baseline
    generated nothing."""
    if baseline["throughput_tok_s"] > 0:
        speedup = candidate["throughput_tok_s"] / baseline["throughput_tok_s"]
        return speedup, f"{COMPARE_CANDIDATE} is {speedup:.2f}x the throughput"
    refused, submitted = baseline["requests"]["rejected"], baseline["requests"]["submitted"]
    why = f"all {submitted} requests were refused" if submitted and refused == submitted else "it generated no tokens"
    label = policy_class(COMPARE_BASELINE).label
    return None, f"no speedup: {label} has no throughput to compare with ({why})"


def compare_table(baseline: dict, candidate: dict, verdict: str) -> Table:
    simulated = baseline.get("simulated")
    title = f"{COMPARE_BASELINE} vs {policy_class(COMPARE_CANDIDATE).label} — {verdict}"
    if simulated is not None:
        title = f"SIMULATED {simulated['device']}: {title} (modelled, not measured)"
    table = Table(title=title, title_justify="left")
    table.add_column("metric")
    table.add_column(COMPARE_BASELINE, justify="right")
    table.add_column(COMPARE_CANDIDATE, justify="right")
    rows = [
        ("generated tok/s", lambda m: f"{m['throughput_tok_s']:.1f}"),
        ("wall time", lambda m: f"{m['wall_time_s']:.1f} s"),
        ("steps", lambda m: str(m["steps"])),
        ("TTFT p50 / p99 (ms)", lambda m: _ms(m["ttft_s"])),
        ("TPOT p50 / p99 (ms)", lambda m: _ms(m["tpot_s"])),
        ("slot utilisation", lambda m: _pct(m["slot_utilization"])),
        ("padding share (finished rows still computed)", lambda m: _pct(m["padding_share"])),
        ("bubble share (empty slots while work waits)", lambda m: _pct(m["bubble_share"])),
        ("free share (empty, nothing waits)", lambda m: _pct(m["free_share"])),
        ("prompt padding (share of tokens computed)", lambda m: _pct(m["prompt_padding_share"])),
        ("tokens computed / generated", lambda m: f"{m['tokens']['computed']} / {m['tokens']['generated']}"),
        ("mean batch size", lambda m: f"{m['batch_size']['mean']:.1f}"),
        (f"decode FLOP/byte (ridge {baseline['roofline']['ridge_flop_per_byte']:.0f})", _decode_point),
        ("preemptions", lambda m: str(m["preemptions"])),
        ("completed / rejected", lambda m: f"{m['requests']['completed']} / {m['requests']['rejected']}"),
    ]
    for label, fmt in rows:
        table.add_row(label, fmt(baseline), fmt(candidate))
    return table


def run_compare(opts: dict, output: str) -> None:
    with bad_input_exits():
        # Closed loop by default: with arrivals spread out both policies would just keep pace.
        setup = build_setup(opts, output=output,
                            time_scale=0.0 if opts["time_scale"] is None else opts["time_scale"],
                            num_requests=opts["num_requests"] or COMPARE_REQUESTS)
    first = build_engine(setup)  # one model, reused: both runs see the same weights (or the same simulation)
    peaks = load_peaks(setup)
    roofs = run_roofs(setup, peaks)  # one machine: what the baseline's steps raised holds for the candidate's
    docs = {}
    for mode in (COMPARE_BASELINE, COMPARE_CANDIDATE):
        config = setup.config.with_(mode=mode)
        engine = Engine(config, runner=first.runner, clock=first.clock)
        result = run_and_report(engine, setup, label=f"{mode:>10} ", roofs=roofs)
        docs[mode] = metrics_document(result, setup, engine.config.as_dict(), peaks, roofs)
        code = exit_code(result)
        if code:
            if deliver_json({"schema": COMPARE_SCHEMA, **docs, "speedup": None}, output):
                note_written(COMPARE_SCHEMA, output)
            sys.exit(code)
    note_raised(roofs)
    speedup, verdict = speedup_of(docs[COMPARE_BASELINE], docs[COMPARE_CANDIDATE])
    if not deliver_json({"schema": COMPARE_SCHEMA, **docs, "speedup": speedup}, output):
        sys.exit(EXIT_ENGINE_FAILURE)
    note_written(COMPARE_SCHEMA, output)
    Console(file=sys.stderr if output in (None, "-") else sys.stdout).print(
        compare_table(docs[COMPARE_BASELINE], docs[COMPARE_CANDIDATE], verdict))
