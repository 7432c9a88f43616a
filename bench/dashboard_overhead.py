"""Engine throughput with the dashboard open vs headless, on the same engine and workload.

    python bench/dashboard_overhead.py [--num-requests 32] [--rounds 5] [--timeline]
    python bench/dashboard_overhead.py --model DIR [--detail]     # with text: a model directory

With a model directory (`batchtop export-checkpoint DIR` makes one) the dashboard also decodes every
token for the slot cells, as `batchtop --model DIR` does; --detail keeps one request's detail view open
(prompt and output streaming) for the whole run. EOS is ignored so both runs do the same work.

Everything that touches torch runs off the main thread, as `batchtop` does (core_engine.torch_thread).
Alternates headless and dashboard runs (the dashboard drawn by Textual in headless mode at 120x36,
polling at its normal rate) and prints generated tok/s of each; the result is the median of the
per-round ratios, since on a shared machine the noise between rounds exceeds the effect measured.
Throughput is measured from the first step's start to the last step's end, so app start-up is not
counted against the dashboard. Target: dashboard >= 90% of headless.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from dataclasses import replace

from batchtop.core_engine.perf.device_peaks import device_peaks
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import SamplingParams
from batchtop.core_engine.model.tokenizer import Tokenizer
from batchtop.core_engine.run.live_session import Session
from batchtop.core_engine.engine.detokenizer import TextDecoder
from batchtop.core_engine.run.headless import run_workload
from batchtop.core_engine.perf.metrics import MetricsCollector
from batchtop.core_engine.run.resolve import resolve_config
from batchtop.core_engine.torch_thread import call_in_thread
from batchtop.core_engine.workload.spec import WorkloadSpec, load_workload
from batchtop.tui.app import BatchtopApp
from batchtop.tui.sources.live import EngineSource


def steady_throughput(collector: MetricsCollector) -> float:
    first_start = collector.first_step_start
    last = collector.last
    return last.counters.generated_tokens / (last.t - first_start)


async def dashboard_run(engine: Engine, requests, config, peaks, timeline: bool, tokenizer: Tokenizer | None,
                        detail: bool) -> float:
    session = Session(engine, requests, text=TextDecoder(tokenizer) if tokenizer is not None else None)
    bridge = EngineSource(engine, requests, session=session, peaks=peaks)
    app = BatchtopApp(bridge)
    async with app.run_test(size=(120, 36)) as pilot:
        if timeline:
            await pilot.press("v")
        if detail:
            while bridge.frame.snapshot is None or bridge.frame.snapshot.slots[0].request_id is None:
                await pilot.pause(0.05)
            await pilot.press("down", "enter")
        while bridge.frame.state != "finished":
            await pilot.pause(0.2)
        await pilot.press("q")
    return steady_throughput(bridge.collector)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeline", action="store_true", help="keep the Slots panel in its (busier) timeline view")
    ap.add_argument("--model", default="auto", help="a preset, or a model directory (text on screen)")
    ap.add_argument("--detail", action="store_true", help="keep a request's detail view open during the run")
    args = ap.parse_args()
    config = resolve_config(model=args.model)
    tokenizer = Tokenizer.from_dir(config.model.checkpoint) if config.model.checkpoint else None
    spec = WorkloadSpec(path="synthetic", num_requests=args.num_requests, prompt_mean=32, output_mean=64)
    requests = [replace(r, sampling=SamplingParams(ignore_eos=True))
                for r in load_workload(spec, config.model.vocab_size)]
    peaks = call_in_thread(lambda: device_peaks(config.device, config.dtype))
    runner = call_in_thread(lambda: Engine(config).runner)
    results = {"headless": [], "dashboard": []}
    for r in range(args.rounds):
        result = call_in_thread(lambda: run_workload(Engine(config, runner=runner), requests))
        results["headless"].append(steady_throughput(result.collector))
        results["dashboard"].append(asyncio.run(dashboard_run(Engine(config, runner=runner), requests, config, peaks,
                                                                args.timeline, tokenizer, args.detail)))
        print(f"round {r + 1}: headless {results['headless'][-1]:.1f} tok/s, "
              f"dashboard {results['dashboard'][-1]:.1f} tok/s, ratio "
              f"{100 * results['dashboard'][-1] / results['headless'][-1]:.1f}%", flush=True)
    ratios = [d / h for h, d in zip(results["headless"], results["dashboard"])]
    view = ("timeline" if args.timeline else "grid") + (", text decoded" if tokenizer else "") + \
        (", detail view open" if args.detail else "")
    print(f"{config.model.name} {config.dtype}, {len(requests)} requests, max_num_seqs {config.max_num_seqs}, "
          f"Slots {view}: dashboard/headless, median of {len(ratios)} paired rounds = "
          f"{100 * statistics.median(ratios):.1f}% (target >= 90%)")


if __name__ == "__main__":
    main()
