"""How far to trust what-if mode: the simulator's predictions against the real engine, side by side.

    flock /tmp/bench.lock python bench/simulate_accuracy.py [--model cpu-demo] [--passes 4] [--json out.json]

The calibration is fitted as `batchtop calibrate` fits it, from decode steps at batch sizes {1, 8, 32}
only, each at contexts 128 and 512 (8 steps per batch size and context per round, each one's median;
the two contexts tell attention's KV read from the GEMMs' per-row work). On a shared host the
machine's speed drifts by 10-20% from one minute to the next, so a fit measured a minute before the
runs it is checked against mostly measures the drift. Here every calibration round is measured in the
same minutes as the runs it predicts, interleaved with them:

1. Decode step time at every batch size 1..64 (the "staircase": one real engine decodes 64 sequences
   whose lengths are staggered, so the batch shrinks 64 -> 1). calibration round, staircase pass,
   calibration round, staircase pass, ..., calibration round. Each pass is predicted from a fit on
   the two rounds either side of it, as each whole run is below (this host has run at two speeds
   minutes apart, a batch-1 step at ~7.5 or ~12 ms, and a pass would otherwise be judged against
   the other speed); each batch size's measured time is the median of its steps over every pass, its
   predicted time the median of the model's times for the same steps (the FLOPs and bytes the
   Roofline panel shows). The error of one fit on all the rounds is printed beside it.
2. Whole runs: a skewed workload (lognormal lengths, all arriving at once) through the real engine and
   through a simulated engine of the same config, in both modes; throughput, TTFT p50 and TPOT p50
   compared. calibration block, real continuous, calibration block, real static, calibration block
   (and again with --repeats 2); each real run is predicted from a fit on the two blocks either side
   of it. The simulated runs schedule on their own (their clock is the model's), so this tests the
   whole what-if path, not just the step-time formula.
The fit never sees a step of any batch size but 1, 8 and 32, nor any step of the runs it predicts
(the staircase's contexts run from ~36 tokens at batch 64 to ~350 at batch 1).
The target is every predicted figure within 10% of measured; each error is printed. So is how many
measured steps took over 3x the model's time for them: the host busy elsewhere, no model's business
(they are counted, never dropped).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.engine.request import Request
from batchtop.core_engine.engine.snapshot import StepCost
from batchtop.core_engine.measure.decode_sweep import StepSample, decode_sweep, sweep_medians
from batchtop.core_engine.measure.device_peaks import device_peaks
from batchtop.core_engine.measure.metrics import MetricsCollector
from batchtop.core_engine.resolve import resolve_config
from batchtop.core_engine.session.driver import run_workload
from batchtop.core_engine.session.workload import WorkloadSpec, load_workload
from batchtop.core_engine.simulate.device import simulated_device
from batchtop.core_engine.simulate.fit import fit_calibration, predict
from batchtop.core_engine.simulate.simulation import Simulation

CALIBRATION_BATCHES = [1, 8, 32]
CALIBRATION_CONTEXTS = [128, 512]  # `batchtop calibrate`'s defaults
CALIBRATION_STEPS = 8
TARGET = 0.10
STALL = 3.0  # a step this many times the model's time for it: the host was busy elsewhere (reported, kept)
REGIONS = ((1, 8), (9, 16), (17, 32), (33, 48), (49, 64))


@dataclass(frozen=True, slots=True)
class Timed:
    """What the bench needs of a measured step (snapshots are not kept: each holds the block map)."""

    num_seqs: int
    cost: StepCost
    step_time_s: float
    context: float = 0.0  # the rows' mean tokens in the cache
    prefill: bool = False  # prompt tokens in the step (static batching's prompt padding included)


def staircase(engine: Engine, largest: int, steps_per_batch: int, prompt: int) -> list[Timed]:
    """Real decode steps at every batch size from `largest` down to 1."""
    engine.load_workload([Request(f"s{i}", tuple(range(1, prompt + 1)), 2 + steps_per_batch * (i + 1))
                          for i in range(largest)])
    steps = []
    while not engine.is_done():
        snap = engine.step()
        if snap.is_step and snap.num_prefill_tokens == 0:
            steps.append(Timed(snap.num_seqs, snap.cost, snap.step_time_s,
                               statistics.mean(sl.num_computed for sl in snap.slots if sl.request_id is not None)))
    return steps


def error(predicted: float, measured: float) -> float:
    return predicted / measured - 1


def flag(e: float) -> str:
    return "" if abs(e) <= TARGET else "  <- outside 10%"


def modelled(cal, snap, peaks) -> float:
    return predict(cal, StepSample(snap.num_seqs, snap.cost, 0.0), peaks)


def stalls(snaps, cal, peaks) -> tuple[int, float]:
    """How many steps (and how many seconds) took over STALL times the model's time for them."""
    slow = [s.step_time_s for s in snaps if s.step_time_s > STALL * modelled(cal, s, peaks)]
    return len(slow), sum(slow)


def summarize(engine_run, snaps: list | None = None) -> dict:
    collector = MetricsCollector()

    def observe(snap) -> None:
        collector.observe(snap)
        if snaps is not None and snap.is_step:
            snaps.append(Timed(snap.num_seqs, snap.cost, snap.step_time_s,
                               prefill=bool(snap.num_prefill_tokens or snap.num_prompt_padding_tokens)))

    result = engine_run(observe)
    if not result.complete:
        raise SystemExit(f"run failed: {result.error}")
    m = collector.summary({})
    return {"throughput tok/s": m["throughput_tok_s"], "TTFT p50 s": m["ttft_s"]["p50"],
            "TPOT p50 s": m["tpot_s"]["p50"]}


class Calibrator:
    """Calibration rounds on the bench's warm model, each kept apart so a fit can pick the ones
    measured in the minutes it is meant to describe."""

    def __init__(self, engine: Engine, peaks) -> None:
        self.engine = engine
        self.peaks = peaks
        self.rounds: list[list[StepSample]] = []
        self.warm = False

    def round(self) -> list[StepSample]:
        samples = decode_sweep(self.engine, CALIBRATION_BATCHES, CALIBRATION_CONTEXTS, CALIBRATION_STEPS,
                               warm_up=not self.warm)
        self.warm = True
        self.rounds.append(samples)
        return samples

    def fit(self, rounds: list[list[StepSample]]):
        samples = [s for r in rounds for s in r]
        assert {s.batch for s in samples} == set(CALIBRATION_BATCHES)  # the fit sees these sizes only
        return fit_calibration(sweep_medians(samples), self.peaks, source="bench",
                               fitted_on={"device": self.peaks.device_name})


def describe_fit(label: str, fit, rounds: list[list[StepSample]]) -> None:
    print(f"{label}: {fit.calibration.describe()}; rms error on its own points {100 * fit.rms_relative_error:.1f}%")
    for context in CALIBRATION_CONTEXTS:  # the drift the interleaving is there to share out
        for batch in CALIBRATION_BATCHES:
            medians = [statistics.median(s.seconds for s in r if (s.batch, s.context) == (batch, context))
                       for r in rounds]
            print(f"  batch {batch:2d} context {context} round medians: " + " ".join(f"{1e3 * m:5.1f}" for m in medians)
                  + f" ms (spread {100 * (max(medians) / min(medians) - 1):.0f}%)")
    for name in fit.held:
        print(f"  {name}: not identified by these steps, kept at the default")
    for name, (lo, hi) in fit.ranges.items():
        if hi / lo > 1.05:
            print(f"  {name}: any value in {lo:.2f}..{hi:.2f} fits equally well (that roof is never met)")


def step_times(calibrator: Calibrator, sweep_config, args) -> dict:
    engine = calibrator.engine
    calibrator.round()  # warms the calibration shapes up, then measures the first round
    staircase(Engine(sweep_config, runner=engine.runner), args.largest, 1, 32)  # every other shape, unmeasured
    first = len(calibrator.rounds) - 1
    passes = []
    for _ in range(args.passes):
        calibrator.round()
        passes.append(staircase(Engine(sweep_config, runner=engine.runner), args.largest, args.steps_per_batch, 32))
    calibrator.round()
    rounds = calibrator.rounds[first:]
    fit = calibrator.fit(rounds)
    cal, peaks = fit.calibration, calibrator.peaks
    # each pass is also predicted from the two rounds either side of it alone, as the whole runs are:
    # the host's speed drifts between minutes, and a pass measured in a slow minute against a fit that
    # is mostly fast minutes measures the drift, not the model
    bracketing = [calibrator.fit(rounds[i:i + 2]).calibration for i in range(len(passes))]
    print(f"\n1. decode step time at batch 1..{args.largest}: {len(rounds)} calibration rounds interleaved with "
          f"{args.passes} staircase passes ({args.steps_per_batch} steps per batch size each, the first after "
          f"a change dropped)")
    describe_fit("fit on those rounds", fit, rounds)
    for i, c in enumerate(bracketing):
        print(f"  pass {i + 1} from the rounds either side: {c.describe()}")
    print("  each step predicted from the rounds either side of its pass (and, last column, from the fit on all)")
    print("  batch  context  measured  predicted   error   (per-pass medians, ms)   fit on all")
    rows = {}
    for batch in range(1, args.largest + 1):
        per_pass = [[s for s in snaps if s.num_seqs == batch][1:] for snaps in passes]
        mine = [s for p in per_pass for s in p]
        measured = statistics.median(s.step_time_s for s in mine)
        predicted = statistics.median(modelled(c, s, peaks) for c, p in zip(bracketing, per_pass) for s in p)
        pooled = error(statistics.median(modelled(cal, s, peaks) for s in mine), measured)
        context = statistics.median(s.context for s in mine)
        e = error(predicted, measured)
        rows[batch] = {"measured_s": measured, "predicted_s": predicted, "error": e, "context": context,
                       "error_fit_on_all": pooled,
                       "pass_medians_s": [statistics.median(s.step_time_s for s in p) for p in per_pass]}
        print(f"  {batch:5d}  {context:7.0f}  {1e3 * measured:6.1f} ms {1e3 * predicted:6.1f} ms  {100 * e:+6.1f}%  ("
              + " ".join(f"{1e3 * m:5.1f}" for m in rows[batch]["pass_medians_s"]) + f")   {100 * pooled:+6.1f}%{flag(e)}")
    within = sum(abs(r["error"]) <= TARGET for r in rows.values())
    within_pooled = sum(abs(r["error_fit_on_all"]) <= TARGET for r in rows.values())
    worst = max(rows, key=lambda b: abs(rows[b]["error"]))
    print(f"  {within}/{len(rows)} batch sizes within 10%; worst: batch {worst} {100 * rows[worst]['error']:+.1f}% "
          f"({within_pooled}/{len(rows)} from the fit on all rounds)")
    print("  mean error by region: " + ", ".join(
        f"{lo}-{hi} {100 * statistics.mean(rows[b]['error'] for b in range(lo, hi + 1) if b in rows):+.1f}%"
        for lo, hi in REGIONS if lo <= args.largest))
    every = [s for snaps in passes for s in snaps]
    n, seconds = stalls(every, cal, peaks)
    print(f"  {n} of {len(every)} staircase steps took over {STALL:g}x the model's time ({seconds:.1f} s of "
          f"{sum(s.step_time_s for s in every):.1f} s)")
    return {"calibration": cal.constants(), "pass_calibrations": [c.constants() for c in bracketing],
            "rows": rows, "within": within, "within_fit_on_all": within_pooled, "count": len(rows),
            "worst_batch": worst, "worst_error": rows[worst]["error"], "stalls": n, "stall_s": seconds}


def whole_runs(calibrator: Calibrator, args) -> list:
    spec = WorkloadSpec(path="synthetic", num_requests=args.num_requests, prompt_mean=args.prompt_mean,
                        output_mean=args.output_mean, length_sigma=1.0)
    run_config = resolve_config(model=args.model, max_num_seqs=args.max_num_seqs)
    requests = load_workload(spec, run_config.model.vocab_size)
    print(f"\n2. whole runs: {len(requests)} requests (lognormal: prompt mean {args.prompt_mean:g}, output mean "
          f"{args.output_mean:g}, sigma 1), all at t=0, max_num_seqs {args.max_num_seqs}; each predicted from "
          f"the calibration blocks ({args.block_rounds} rounds) measured just before and just after it")

    def block() -> list[list[StepSample]]:
        return [calibrator.round() for _ in range(args.block_rounds)]

    before = block()
    out = []
    for repeat in range(args.repeats):
        for mode in ("continuous", "static"):
            config = run_config.with_(mode=mode)
            started, snaps = time.perf_counter(), []
            real = summarize(lambda observe: run_workload(Engine(config, runner=calibrator.engine.runner), requests,
                                                          on_step=observe), snaps)
            took = time.perf_counter() - started
            after = block()
            fit = calibrator.fit(before + after)
            simulation = Simulation(simulated_device("cpu"), calibrator.peaks, fit.calibration)
            sim = summarize(lambda observe: run_workload(simulation.engine(config), requests, on_step=observe))
            n, seconds = stalls(snaps, fit.calibration, calibrator.peaks)
            print(f"\n  {mode} run {repeat + 1} (real run {took:.0f} s; {n} of its {len(snaps)} steps took over "
                  f"{STALL:g}x the model's time, {seconds:.1f} s)")
            describe_fit("  fit on the blocks either side", fit, before + after)
            for kind in (False, True):  # the real run's own steps, each beside the model's time for it
                mine = [t for t in snaps if t.prefill == kind]
                if not mine:
                    continue
                measured = sum(t.step_time_s for t in mine)
                predicted = sum(modelled(fit.calibration, t, calibrator.peaks) for t in mine)
                median = statistics.median(error(modelled(fit.calibration, t, calibrator.peaks), t.step_time_s)
                                           for t in mine)
                print(f"  its {len(mine)} {'prefill' if kind else 'decode'} steps: {measured:.1f} s measured, "
                      f"{predicted:.1f} s by the model ({100 * error(predicted, measured):+.1f}%; median step "
                      f"{100 * median:+.1f}%)")
            errors = {}
            for key in real:
                e = error(sim[key], real[key])
                errors[key] = e
                print(f"  {mode:>10} {key:<16} measured {real[key]:9.4g} simulated {sim[key]:9.4g} {100 * e:+6.1f}%"
                      f"{flag(e)}", flush=True)
            out.append({"mode": mode, "repeat": repeat + 1, "calibration": fit.calibration.constants(),
                        "measured": real, "simulated": sim, "errors": errors, "stalls": n, "stall_s": seconds})
            before = after
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cpu-demo")
    ap.add_argument("--largest", type=int, default=64, help="decode batch sizes 1..this")
    ap.add_argument("--passes", type=int, default=4, help="staircase passes, a calibration round before each")
    ap.add_argument("--steps-per-batch", type=int, default=5, help="staircase steps at each batch size per pass")
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--prompt-mean", type=float, default=16)
    ap.add_argument("--output-mean", type=float, default=48)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=1, help="whole-run pairs (continuous, static)")
    ap.add_argument("--block-rounds", type=int, default=2, help="calibration rounds between two whole runs")
    ap.add_argument("--json", help="write every figure and its error here")
    args = ap.parse_args()
    started = time.perf_counter()
    sweep_config = resolve_config(model=args.model, max_num_seqs=args.largest, max_num_batched_tokens=4096,
                                  num_kv_blocks=4096)
    engine = Engine(sweep_config)
    peaks = device_peaks(sweep_config.device, sweep_config.dtype)
    print(f"{sweep_config.model.name} ({sweep_config.dtype}) on {peaks.device_name}; roofs "
          f"{peaks.peak_flops / 1e9:.0f} GFLOP/s, {peaks.peak_bytes_per_s / 1e9:.1f} GB/s ({peaks.source}); "
          f"calibrated on batch {CALIBRATION_BATCHES} only (contexts {CALIBRATION_CONTEXTS}, "
          f"{CALIBRATION_STEPS} steps each per round)", flush=True)
    calibrator = Calibrator(engine, peaks)
    steps = step_times(calibrator, sweep_config, args)
    runs = whole_runs(calibrator, args)

    figures = [abs(e) for r in runs for e in r["errors"].values()]
    print(f"\nsummary: decode step time {steps['within']}/{steps['count']} batch sizes within 10% (worst batch "
          f"{steps['worst_batch']} {100 * steps['worst_error']:+.1f}%); whole runs "
          + "; ".join(f"{r['mode']} {r['repeat']} " + "/".join(f"{100 * e:+.1f}%" for e in r["errors"].values())
                      for r in runs)
          + f" (throughput/TTFT p50/TPOT p50); every figure within 10%: "
          f"{'yes' if steps['within'] == steps['count'] and max(figures) <= TARGET else 'no'}; steps over "
          f"{STALL:g}x the model's time (host busy elsewhere): staircase {steps['stalls']}, whole runs "
          + ", ".join(str(r["stalls"]) for r in runs))
    elapsed = time.perf_counter() - started
    print(f"(bench ran {elapsed:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": peaks.device_name, "model": args.model, "dtype": sweep_config.dtype,
                       "step_times": steps, "whole_runs": runs, "elapsed_s": elapsed,
                       "calibration_rounds": [[s.as_dict() for s in r] for r in calibrator.rounds]}, f, indent=1)


if __name__ == "__main__":
    main()
