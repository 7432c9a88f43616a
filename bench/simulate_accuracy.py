"""How far to trust what-if mode: the simulator's predictions against the real engine, side by side.

    flock -x /tmp/batchtop-cpu.lock python bench/simulate_accuracy.py [--model cpu-demo] [--num-requests 256]

1. Calibrates on this device exactly as `batchtop calibrate` does, from decode steps at batch sizes
   {1, 8, 32} only.
2. Decode step time at every batch size 1..64: one real engine decodes 64 sequences whose lengths are
   staggered, so the batch shrinks 64 -> 1; each measured step is set beside the model's time for the
   same step (the same FLOPs and bytes the Roofline panel shows).
3. Whole runs: a skewed workload (lognormal lengths, all arriving at once) through the real engine and
   through a simulated engine of the same config, in both modes; throughput, TTFT p50 and TPOT p50
   compared. The simulated runs schedule on their own (their clock is the model's), so this tests the
   whole what-if path, not just the step-time formula.
The target is every predicted figure within 10% of measured; each error is printed.
"""

from __future__ import annotations

import argparse
import statistics
import time

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.engine.request import Request
from batchtop.core_engine.measure.decode_sweep import StepSample, batch_medians, decode_sweep
from batchtop.core_engine.measure.device_peaks import device_peaks
from batchtop.core_engine.measure.metrics import MetricsCollector
from batchtop.core_engine.resolve import resolve_config
from batchtop.core_engine.session.driver import run_workload
from batchtop.core_engine.session.workload import WorkloadSpec, load_workload
from batchtop.core_engine.simulate.device import simulated_device
from batchtop.core_engine.simulate.fit import fit_calibration, predict
from batchtop.core_engine.simulate.simulation import Simulation

CALIBRATION_BATCHES = [1, 8, 32]
TARGET = 0.10


def staircase(engine: Engine, largest: int, steps_per_batch: int, prompt: int) -> list:
    """Real decode steps at every batch size from `largest` down to 1."""
    engine.load_workload([Request(f"s{i}", tuple(range(1, prompt + 1)), 2 + steps_per_batch * (i + 1))
                          for i in range(largest)])
    snaps = []
    while not engine.is_done():
        snap = engine.step()
        if snap.is_step and snap.num_prefill_tokens == 0:
            snaps.append(snap)
    return snaps


def error(predicted: float, measured: float) -> float:
    return predicted / measured - 1


def summarize(engine_run) -> dict:
    collector = MetricsCollector()
    result = engine_run(collector.observe)
    if not result.complete:
        raise SystemExit(f"run failed: {result.error}")
    m = collector.summary({})
    return {"throughput tok/s": m["throughput_tok_s"], "TTFT p50 s": m["ttft_s"]["p50"],
            "TPOT p50 s": m["tpot_s"]["p50"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cpu-demo")
    ap.add_argument("--largest", type=int, default=64, help="decode batch sizes 1..this")
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--prompt-mean", type=float, default=16)
    ap.add_argument("--output-mean", type=float, default=48)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    args = ap.parse_args()
    started = time.perf_counter()
    sweep_config = resolve_config(model=args.model, max_num_seqs=args.largest, max_num_batched_tokens=4096,
                                  num_kv_blocks=4096)
    engine = Engine(sweep_config)
    peaks = device_peaks(sweep_config.device, sweep_config.dtype)
    print(f"{sweep_config.model.name} ({sweep_config.dtype}) on {peaks.device_name}; roofs "
          f"{peaks.peak_flops / 1e9:.0f} GFLOP/s, {peaks.peak_bytes_per_s / 1e9:.1f} GB/s ({peaks.source})", flush=True)

    samples = batch_medians(decode_sweep(engine, CALIBRATION_BATCHES, 128, 8, rounds=3))  # as `batchtop calibrate`
    fit = fit_calibration(samples, peaks, source="bench", fitted_on={"device": peaks.device_name})
    cal = fit.calibration
    print(f"calibrated on batch {CALIBRATION_BATCHES} (context 128): {cal.describe()}; "
          f"rms error on its own points {100 * fit.rms_relative_error:.1f}%")
    for name, (lo, hi) in fit.ranges.items():
        if hi / lo > 1.05:
            print(f"  {name}: any value in {lo:.2f}..{hi:.2f} fits equally well (that roof is never met)")

    snaps = staircase(Engine(sweep_config, runner=engine.runner), args.largest, 5, 32)
    print("\ndecode step time, measured vs predicted (median of each batch size's steps):")
    errors = {}
    for batch in range(args.largest, 0, -1):
        mine = [s for s in snaps if s.num_seqs == batch][1:]  # the first step after a change warms up
        measured = statistics.median(s.step_time_s for s in mine)
        predicted = statistics.median(predict(cal, StepSample(batch, s.cost.flops, s.cost.bytes, 0.0), peaks)
                                      for s in mine)
        errors[batch] = (measured, predicted, error(predicted, measured))
    for batch in sorted(errors):
        measured, predicted, e = errors[batch]
        print(f"  batch {batch:2d}: {1e3 * measured:6.1f} ms measured {1e3 * predicted:6.1f} ms predicted "
              f"{100 * e:+6.1f}%{'' if abs(e) <= TARGET else '  <- outside 10%'}")
    within = sum(abs(e) <= TARGET for _, _, e in errors.values())
    worst = max(errors, key=lambda b: abs(errors[b][2]))
    print(f"  {within}/{len(errors)} batch sizes within 10%; worst: batch {worst} {100 * errors[worst][2]:+.1f}%")

    spec = WorkloadSpec(path="synthetic", num_requests=args.num_requests, prompt_mean=args.prompt_mean,
                        output_mean=args.output_mean, length_sigma=1.0)
    run_config = resolve_config(model=args.model, max_num_seqs=args.max_num_seqs)
    requests = load_workload(spec, run_config.model.vocab_size)
    simulation = Simulation(simulated_device("cpu"), peaks, cal)
    print(f"\nwhole runs: {len(requests)} requests (lognormal: prompt mean {args.prompt_mean:g}, output mean "
          f"{args.output_mean:g}, sigma 1), all at t=0, max_num_seqs {args.max_num_seqs}")
    for mode in ("continuous", "static"):
        config = run_config.with_(mode=mode)
        real = summarize(lambda observe: run_workload(Engine(config, runner=engine.runner), requests, on_step=observe))
        sim = summarize(lambda observe: run_workload(simulation.engine(config), requests, on_step=observe))
        for key in real:
            e = error(sim[key], real[key])
            print(f"  {mode:>10} {key:<16} measured {real[key]:9.4g} simulated {sim[key]:9.4g} {100 * e:+6.1f}%"
                  f"{'' if abs(e) <= TARGET else '  <- outside 10%'}", flush=True)
    print(f"\n(bench ran {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
