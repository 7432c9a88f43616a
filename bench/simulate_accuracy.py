"""How far to trust what-if mode: the simulator's predictions against the real engine, side by side.

    flock /tmp/bench.lock python bench/simulate_accuracy.py [--model cpu-demo] [--passes 8] [--json out.json]
    flock /tmp/bench.lock python bench/simulate_accuracy.py --no-staircase   # the held-out workloads only

The calibration is fitted as `batchtop calibrate` fits it, from decode steps at batch sizes {1, 8, 32}
only, each at two contexts (from 128 and 512 tokens: the two tell attention's KV read from the GEMMs'
per-row work), each point's mean step (steps over 3x its median, a neighbour's burst, left out). On a
shared host the machine's speed drifts from one second to the next (a batch-1 step has taken 7.5 ms
one minute and 12 ms the next, and calibration rounds taken 20 s apart disagreed by up to 75%), so a
fit measured at other times than the steps it is checked against mostly measures the drift. Here
every measured step is followed by one calibration step (the six points in turn, each on an engine
and KV pool of its own sharing the model's weights: core_engine.measure.decode_sweep.DecodeProbes),
so the calibration sees the same seconds of the host as the steps it predicts:

1. Decode step time at every batch size 1..64 (the "staircase": one real engine decodes 64 sequences
   whose lengths are staggered, so the batch shrinks 64 -> 1), several passes, each predicted from a
   fit on the calibration steps taken between its own steps. Each batch size's measured time is its
   mean step over every pass, bursts left out as in the calibration; its predicted time the mean of
   the model's times for the same steps (the FLOPs and bytes the Roofline panel shows). Means, as the
   calibration's: the host flips between speeds faster than a batch size lasts in one pass (~0.2 s),
   so a median over a few passes lands on one speed or the other. The error of one fit on all the
   calibration steps is printed beside it.
2. Held-out workloads (HELD_OUT; --workloads picks): other lengths, slot counts and arrivals than any
   step the fit saw (skewed short chats at 16 slots in both modes; issue 52's 96 requests of 64/128
   tokens; long prompts, mostly 256-token prefill chunks, at 8 slots; Poisson arrivals at 32 slots),
   each run through the real engine and through a simulated engine of the same config; throughput,
   TTFT p50 and TPOT p50 compared. The real run's clock leaves out the time spent in the calibration
   steps between its own (arrivals are on that clock too), and each run is predicted from a fit on
   the calibration steps taken during it. The workload's first prompts run once before it, unmeasured:
   the first chunk of a new size pays first touches the what-if has no start-up for. The simulated
   runs schedule on their own (their clock is the model's), so this tests the whole what-if path.
The fit's roofs are the measured ones raised to what its steps did (calibration_fit, seen_roofs), as
`batchtop calibrate` writes them; the simulated runs time their steps by them.
The fit never sees a step of any batch size but 1, 8 and 32, nor any step of the runs it predicts
(the staircase's contexts run from ~36 tokens at batch 64 to ~350 at batch 1).
The target is every predicted figure within 10% of measured; each error is printed, and so is how
many steps a burst on the host took.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import dataclass

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request
from batchtop.core_engine.model.cost import StepCost
from batchtop.core_engine.perf.decode_sweep import (BURST, COST_FIELDS, DecodeProbes, StepSample, sweep_means,
                                                      sweep_points, typical_seconds)
from batchtop.core_engine.perf.device_peaks import device_peaks
from batchtop.core_engine.perf.metrics import MetricsCollector
from batchtop.core_engine.run.resolve import resolve_config
from batchtop.core_engine.run.headless import run_workload
from batchtop.core_engine.workload.spec import WorkloadSpec, load_workload
from batchtop.core_engine.simulate.simulated_devices import simulated_device
from batchtop.core_engine.simulate.calibration_fit import fit_calibration, predict
from batchtop.core_engine.simulate.simulation import Simulation

CALIBRATION_BATCHES = [1, 8, 32]
CALIBRATION_CONTEXTS = [128, 512]  # `batchtop calibrate`'s defaults
PROBE_STEPS = 256  # a calibration point's steps before it starts over (its context grows a token a step)
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

    def as_dict(self) -> dict:
        return {"num_seqs": self.num_seqs, "context": self.context, "prefill": self.prefill,
                **{name: getattr(self.cost, name) for name in COST_FIELDS}, "seconds": self.step_time_s}


def staircase(engine: Engine, largest: int, steps_per_batch: int, prompt: int, between=None) -> list[Timed]:
    """Real steps at every batch size from `largest` down to 1 (the prompts' first); `between()` runs
    after each step."""
    engine.load_workload([Request(f"s{i}", tuple(range(1, prompt + 1)), 2 + steps_per_batch * (i + 1))
                          for i in range(largest)])
    steps = []
    while not engine.is_done():
        snap = engine.step()
        if snap.is_step:
            steps.append(Timed(snap.num_seqs, snap.cost, snap.step_time_s,
                               statistics.mean(sl.num_computed for sl in snap.slots if sl.request_id is not None),
                               prefill=snap.num_prefill_tokens > 0))
            if between is not None:
                between()
    return steps


def error(predicted: float, measured: float) -> float:
    return predicted / measured - 1


def flag(e: float) -> str:
    return "" if abs(e) <= TARGET else "  <- outside 10%"


def modelled(cal, snap, peaks) -> float:
    """The model's time for a step, on the roofs the calibration was fitted against (raised where its
    steps beat the measured ones), as a --simulate run of this device times it."""
    return predict(cal, StepSample(snap.num_seqs, snap.cost, 0.0), cal.roofs_on(peaks))


def stalls(snaps, cal, peaks) -> tuple[int, float]:
    """How many steps (and how many seconds) took over STALL times the model's time for them."""
    slow = [s.step_time_s for s in snaps if s.step_time_s > STALL * modelled(cal, s, peaks)]
    return len(slow), sum(slow)


def summarize(engine_run, snaps: list | None = None, after=None) -> dict:
    collector = MetricsCollector()

    def observe(snap) -> None:
        collector.observe(snap)
        if snaps is not None and snap.is_step:
            snaps.append(Timed(snap.num_seqs, snap.cost, snap.step_time_s,
                               prefill=bool(snap.num_prefill_tokens or snap.num_prompt_padding_tokens)))
        if after is not None and snap.is_step:
            after()

    result = engine_run(observe)
    if not result.complete:
        raise SystemExit(f"run failed: {result.error}")
    m = collector.summary({})
    return {"throughput tok/s": m["throughput_tok_s"], "TTFT p50 s": m["ttft_s"]["p50"],
            "TPOT p50 s": m["tpot_s"]["p50"]}


class Probed:
    """The bench's calibration: decode steps at the calibration points, one after each measured step,
    and fits to them. `clock` is perf_counter less the time spent in those steps, for a real run whose
    latencies must be its own steps' and not the probes' between them."""

    def __init__(self, engine: Engine, peaks) -> None:
        self.probes = DecodeProbes(engine, CALIBRATION_BATCHES, CALIBRATION_CONTEXTS, PROBE_STEPS)
        self.engine = engine
        self.peaks = peaks
        self._excluded = 0.0

    def clock(self) -> float:
        return time.perf_counter() - self._excluded

    def after(self, taken: list[StepSample]):
        """What to run after each measured step: one probe step, kept in `taken`, its time off the clock."""
        def probe() -> None:
            started = time.perf_counter()
            taken.append(self.probes.step())
            self._excluded += time.perf_counter() - started
        return probe

    def fit(self, samples: list[StepSample], keep_bursts: bool = False):
        """keep_bursts: fit every probe step's time, as a whole run's time holds every one of its own
        steps (a neighbour's burst slows both; left out of the probes alone, the run reads slower than
        the fit by the bursts' share: 2.2x on a host whose speed swung 10x within one run)."""
        assert {s.batch for s in samples} == set(CALIBRATION_BATCHES)  # the fit sees these sizes only
        return fit_calibration(all_means(samples) if keep_bursts else sweep_means(samples), self.peaks,
                               source="bench", fitted_on={"device": self.peaks.device_name})


def all_means(samples: list[StepSample]) -> list[StepSample]:
    """One sample per calibration point: the mean of every step's time and work, bursts kept."""
    out = []
    for batch, context in sweep_points(samples):
        mine = [s for s in samples if (s.batch, s.context) == (batch, context)]
        out.append(StepSample(batch, StepCost(*(statistics.mean(getattr(s.cost, name) for s in mine)
                                                for name in COST_FIELDS)),
                              statistics.mean(s.seconds for s in mine), context))
    return out


def describe_fit(label: str, fit, groups: list[list[StepSample]], unit: str) -> None:
    """The fit, and each calibration point's typical step in each group of its steps: the drift it shares out."""
    print(f"{label}: {fit.calibration.describe()}; rms error on its own points {100 * fit.rms_relative_error:.1f}%")
    for context in CALIBRATION_CONTEXTS:
        for batch in CALIBRATION_BATCHES:
            means = [typical_seconds([s.seconds for s in g if (s.batch, s.context) == (batch, context)])[0]
                     for g in groups]
            print(f"  batch {batch:2d} context {context} {unit} means: " + " ".join(f"{1e3 * m:5.1f}" for m in means)
                  + f" ms (spread {100 * (max(means) / min(means) - 1):.0f}%)")
    for caveat in fit.caveats():
        print(f"  {caveat}")


def probed_passes(probed: Probed, sweep_config, args) -> tuple[list[list[Timed]], list[list[StepSample]]]:
    """Staircase passes, each step followed by one calibration step: the steps measured and the
    calibration steps taken right after each, index for index."""
    runner = probed.engine.runner
    # every shape once, unmeasured, with the calibration steps between them as in the passes (their
    # prefills too), so the first pass meets nothing the others do not
    staircase(Engine(sweep_config, runner=runner), args.largest, 1, 32, between=probed.after([]))
    passes, taken = [], []
    for _ in range(args.passes):
        taken.append([])
        passes.append(staircase(Engine(sweep_config, runner=runner), args.largest, args.steps_per_batch, 32,
                                between=probed.after(taken[-1])))
    return passes, taken


def step_times(probed: Probed, sweep_config, args) -> dict:
    passes, taken_in = probed_passes(probed, sweep_config, args)
    peaks = probed.peaks
    fit = probed.fit([s for taken in taken_in for s in taken])
    cal = fit.calibration
    # each pass is predicted from the calibration steps taken between its own steps: the host's speed
    # drifts from one pass to the next, and a fit on other seconds measures that drift
    per_pass = [probed.fit(taken).calibration for taken in taken_in]
    print(f"\n1. decode step time at batch 1..{args.largest}: {args.passes} staircase passes ({args.steps_per_batch} "
          f"steps per batch size each, the first after a change dropped), every step followed by one calibration "
          f"step (batch {CALIBRATION_BATCHES} x context {CALIBRATION_CONTEXTS} in turn, on the same weights)")
    describe_fit("fit on every calibration step", fit, taken_in, "pass")
    for i, c in enumerate(per_pass):
        print(f"  pass {i + 1} from its own calibration steps: {c.describe()}")
    print(f"  each batch size's mean step (steps over {BURST:g}x its median left out), each pass predicted from "
          f"its own calibration steps (and, last column, from the fit on all of them)")
    print("  batch  context  measured  predicted   error (95%)     (per-pass means, ms)   fit on all")
    rows, bursts = {}, 0
    for batch in range(1, args.largest + 1):
        mine = [[s for s in snaps if s.num_seqs == batch and not s.prefill][1:] for snaps in passes]
        measured, kept = typical_seconds([s.step_time_s for p in mine for s in p])
        bursts += kept.count(False)
        pairs = [(c, s) for c, p in zip(per_pass, mine) for s in p]
        predicted = statistics.mean(modelled(c, s, peaks) for (c, s), k in zip(pairs, kept) if k)
        pooled = error(statistics.mean(modelled(cal, s, peaks) for (_, s), k in zip(pairs, kept) if k), measured)
        e = error(predicted, measured)
        # how sure the error itself is: the spread of the passes' own errors (each pass its own fit)
        pass_means = [statistics.mean(s.step_time_s for s in p) for p in mine]
        pass_errors = [error(statistics.mean(modelled(c, s, peaks) for s in p), m)
                       for c, p, m in zip(per_pass, mine, pass_means)]
        margin = 2 * statistics.stdev(pass_errors) / len(pass_errors) ** 0.5 if len(pass_errors) > 1 else math.inf
        rows[batch] = {"measured_s": measured, "predicted_s": predicted, "error": e, "error_95": margin,
                       "error_fit_on_all": pooled, "context": statistics.mean(s.context for _, s in pairs),
                       "bursts_left_out": kept.count(False),
                       "pass_means_s": pass_means}
        print(f"  {batch:5d}  {rows[batch]['context']:7.0f}  {1e3 * measured:6.1f} ms {1e3 * predicted:6.1f} ms  "
              f"{100 * e:+6.1f}% ±{100 * margin:4.1f}  ("
              + " ".join(f"{1e3 * m:5.1f}" for m in rows[batch]["pass_means_s"])
              + f")   {100 * pooled:+6.1f}%{flag(e)}")
    within = sum(abs(r["error"]) <= TARGET for r in rows.values())
    within_pooled = sum(abs(r["error_fit_on_all"]) <= TARGET for r in rows.values())
    worst = max(rows, key=lambda b: abs(rows[b]["error"]))
    misses = [b for b, r in rows.items() if abs(r["error"]) > TARGET]
    unsure = [b for b in misses if abs(rows[b]["error"]) - rows[b]["error_95"] <= TARGET]
    print(f"  {within}/{len(rows)} batch sizes within 10%; worst: batch {worst} {100 * rows[worst]['error']:+.1f}% "
          f"({within_pooled}/{len(rows)} from the fit on every calibration step); of the {len(misses)} outside, "
          f"{len(unsure)} within 10% at the edge of their own 95% interval (the passes disagree that much)")
    print("  mean error by region: " + ", ".join(
        f"{lo}-{hi} {100 * statistics.mean(rows[b]['error'] for b in range(lo, hi + 1) if b in rows):+.1f}%"
        for lo, hi in REGIONS if lo <= args.largest))
    print(f"  {bursts} staircase steps over {BURST:g}x their batch size's median left out (a neighbour's burst)")
    return {"calibration": cal.constants(), "pass_calibrations": [c.constants() for c in per_pass],
            "rows": rows, "within": within, "within_fit_on_all": within_pooled, "count": len(rows),
            "outside_but_within_their_95": unsure,
            "worst_batch": worst, "worst_error": rows[worst]["error"], "stalls": bursts,
            "staircase_steps": [[s.as_dict() for s in snaps] for snaps in passes],
            "calibration_steps": [[s.as_dict() for s in taken] for taken in taken_in]}


@dataclass(frozen=True, slots=True)
class HeldOut:
    """A workload the fit never sees a step of: other lengths, slot counts and arrivals than its probes'."""

    name: str
    num_requests: int
    prompt_mean: float
    output_mean: float
    max_num_seqs: int
    rate: float = 0.0  # Poisson arrivals per second of the run's own clock; 0: all at t=0
    modes: tuple[str, ...] = ("continuous",)

    def describe(self) -> str:
        arrivals = f"Poisson {self.rate:g}/s" if self.rate else "all at t=0"
        return (f"{self.num_requests} requests (lognormal: prompt mean {self.prompt_mean:g}, output mean "
                f"{self.output_mean:g}, sigma 1), {arrivals}, max_num_seqs {self.max_num_seqs}")


HELD_OUT = (
    HeldOut("skewed", 256, 16, 48, 16, modes=("continuous", "static")),
    HeldOut("issue-52", 96, 64, 128, 16),  # `--workload synthetic --num-requests 96`, 16 slots (issue 52)
    HeldOut("long-prompts", 32, 192, 24, 8),  # mostly 256-token prefill chunks: compute-bound steps
    HeldOut("poisson-32", 96, 32, 64, 32, rate=12.0),  # arrivals over time, twice the slots
)


def warm_up(probed: Probed, config, requests: list[Request]) -> None:
    """The workload's first prompts once, unmeasured: the first step to run a prompt chunk of a new size
    has taken 2 s where the next took 0.14 (first touches), a start-up the what-if does not model."""
    few = [Request(f"warm-{r.id}", r.prompt_token_ids, 2) for r in requests[:config.max_num_seqs]]
    run_workload(Engine(config, runner=probed.engine.runner, clock=probed.clock), few)


def whole_runs(probed: Probed, args) -> list:
    peaks = probed.peaks
    out = []
    chosen = [w for w in HELD_OUT if w.name in args.workloads]
    for repeat in range(args.repeats):
        for work in chosen:
            spec = WorkloadSpec(path="synthetic", num_requests=work.num_requests, prompt_mean=work.prompt_mean,
                                output_mean=work.output_mean, length_sigma=1.0, rate=work.rate)
            run_config = resolve_config(model=args.model, max_num_seqs=work.max_num_seqs)
            requests = load_workload(spec, run_config.model.vocab_size)
            print(f"\n2. held-out workload {work.name}: {work.describe()}; predicted from the calibration steps "
                  f"taken between its own steps (off its clock)")
            for mode in work.modes:
                config = run_config.with_(mode=mode)
                warm_up(probed, config, requests)
                started, snaps, taken = time.perf_counter(), [], []
                real = summarize(lambda observe: run_workload(
                    Engine(config, runner=probed.engine.runner, clock=probed.clock), requests, on_step=observe),
                    snaps, after=probed.after(taken))
                took = time.perf_counter() - started
                fit = probed.fit(taken, keep_bursts=True)
                simulation = Simulation(simulated_device("cpu"), peaks, fit.calibration)
                sim = summarize(lambda observe: run_workload(simulation.engine(config), requests, on_step=observe))
                n, seconds = stalls(snaps, fit.calibration, peaks)
                print(f"\n  {work.name} {mode} run {repeat + 1} ({took:.0f} s with its calibration steps; {n} of its "
                      f"{len(snaps)} steps took over {STALL:g}x the model's time, {seconds:.1f} s)")
                quarter = -(-len(taken) // 4)
                describe_fit("  fit on its calibration steps", fit,
                             [taken[i:i + quarter] for i in range(0, len(taken), quarter)], "quarter")
                for kind in (False, True):  # the real run's own steps, each beside the model's time for it
                    mine = [t for t in snaps if t.prefill == kind]
                    if not mine:
                        continue
                    measured = sum(t.step_time_s for t in mine)
                    predicted = sum(modelled(fit.calibration, t, peaks) for t in mine)
                    median = statistics.median(error(modelled(fit.calibration, t, peaks), t.step_time_s) for t in mine)
                    print(f"  its {len(mine)} {'prefill' if kind else 'decode'} steps: {measured:.1f} s measured, "
                          f"{predicted:.1f} s by the model ({100 * error(predicted, measured):+.1f}%; median step "
                          f"{100 * median:+.1f}%)")
                errors = {}
                for key in real:
                    e = error(sim[key], real[key])
                    errors[key] = e
                    print(f"  {mode:>10} {key:<16} measured {real[key]:9.4g} simulated {sim[key]:9.4g} "
                          f"{100 * e:+6.1f}%{flag(e)}", flush=True)
                out.append({"workload": work.name, "mode": mode, "repeat": repeat + 1,
                            "calibration": fit.calibration.constants(), "roofs": fit.calibration.roofs.as_dict(),
                            "measured": real, "simulated": sim, "errors": errors, "stalls": n, "stall_s": seconds,
                            "calibration_steps": [s.as_dict() for s in taken]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cpu-demo")
    ap.add_argument("--largest", type=int, default=64, help="decode batch sizes 1..this")
    ap.add_argument("--passes", type=int, default=8, help="staircase passes")
    ap.add_argument("--steps-per-batch", type=int, default=5, help="staircase steps at each batch size per pass")
    ap.add_argument("--workloads", type=lambda t: t.split(","), default=[w.name for w in HELD_OUT],
                    help="held-out workloads, comma-separated: " + ", ".join(w.name for w in HELD_OUT))
    ap.add_argument("--no-staircase", action="store_true", help="the held-out workloads only (a few minutes)")
    ap.add_argument("--repeats", type=int, default=1, help="rounds of the held-out workloads")
    ap.add_argument("--json", help="write every figure and its error here")
    args = ap.parse_args()
    started = time.perf_counter()
    sweep_config = resolve_config(model=args.model, max_num_seqs=args.largest, max_num_batched_tokens=4096,
                                  num_kv_blocks=4096)
    engine = Engine(sweep_config)
    peaks = device_peaks(sweep_config.device, sweep_config.dtype)
    print(f"{sweep_config.model.name} ({sweep_config.dtype}) on {peaks.device_name}; roofs "
          f"{peaks.peak_flops / 1e9:.0f} GFLOP/s, {peaks.peak_bytes_per_s / 1e9:.1f} GB/s ({peaks.source}); "
          f"calibrated on batch {CALIBRATION_BATCHES} only (contexts from {CALIBRATION_CONTEXTS}, "
          f"{PROBE_STEPS} steps each before it starts over)", flush=True)
    unknown = sorted(set(args.workloads) - {w.name for w in HELD_OUT})
    if unknown:
        raise SystemExit(f"unknown --workloads {', '.join(unknown)} (choose {', '.join(w.name for w in HELD_OUT)})")
    probed = Probed(engine, peaks)
    steps = None if args.no_staircase else step_times(probed, sweep_config, args)
    runs = whole_runs(probed, args)

    figures = [abs(e) for r in runs for e in r["errors"].values()]
    staircase_ok = steps is None or steps["within"] == steps["count"]
    print("\nsummary: " + ("" if steps is None else
          f"decode step time {steps['within']}/{steps['count']} batch sizes within 10% (worst batch "
          f"{steps['worst_batch']} {100 * steps['worst_error']:+.1f}%; {len(steps['outside_but_within_their_95'])} "
          f"of the misses within 10% at the edge of their 95% interval); ") + "held-out workloads "
          + "; ".join(f"{r['workload']} {r['mode']} {r['repeat']} " + "/".join(f"{100 * e:+.1f}%"
                                                                            for e in r["errors"].values())
                      for r in runs)
          + f" (throughput/TTFT p50/TPOT p50); worst {100 * max(figures, default=0):.1f}%; every figure within 10%: "
          f"{'yes' if staircase_ok and max(figures, default=0) <= TARGET else 'no'}; fitted efficiencies at most 1: "
          + ("yes" if all(max(r["calibration"][n] for n in ("compute_efficiency", "memory_efficiency",
                                                                "attention_efficiency")) <= 1 for r in runs) else "no")
          + "; host busy elsewhere: " + ("" if steps is None else f"{steps['stalls']} staircase steps over "
                                          f"{BURST:g}x their batch size's median, ")
          + f"held-out runs' steps over {STALL:g}x the model's time " + ", ".join(str(r["stalls"]) for r in runs))
    elapsed = time.perf_counter() - started
    print(f"(bench ran {elapsed:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": peaks.device_name, "model": args.model, "dtype": sweep_config.dtype,
                       "step_times": steps, "whole_runs": runs, "elapsed_s": elapsed}, f, indent=1)


if __name__ == "__main__":
    main()
