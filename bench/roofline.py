"""How close decode steps come to this device's roofs, each round against roofs measured in that round.

    python bench/roofline.py [--model auto] [--weights auto] [--batches 1,32] [--context 256] [--rounds 3]
                             [--steps 30]

Each round measures the device's peaks afresh (device_peaks.measure_peaks: a copy and, where batchtop's
CPU kernels run, their GEMM and a 256 MiB GEMV), then runs real decode steps at each batch size and
prints, for each: arithmetic intensity, achieved FLOP/s and bytes/s over the forward's time (bytes as
stored: a GGUF's quantized blocks where they run quantized), and the fraction of that round's roof at
that intensity. A shared machine's memory bandwidth moves with its neighbours (37 to 61 GB/s on the same
2-core host within a day), so a step is set against the roof of its own round; the roofs the dashboard
shows are the best this machine was ever seen to do (cached), printed last with the fractions against
them. It also times the batch-1 matmuls alone (every weight once, no attention, no Python between them
but the module calls): the ceiling the kernels themselves set.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.model.quant_linear import QuantLinear
from batchtop.core_engine.model.weight_bytes import weights_text
from batchtop.core_engine.perf.decode_sweep import decode_steps
from batchtop.core_engine.perf.device_peaks import DevicePeaks, device_peaks, measure_peaks
from batchtop.core_engine.run.resolve import resolve_config


def stored_bytes(module: torch.nn.Module) -> int:
    """Bytes a matmul module streams: its blocks (quantized) or its weight."""
    tensors = list(module.blocks) if isinstance(module, QuantLinear) else [module.weight]
    return sum(t.numel() * t.element_size() for t in tensors)


def gemv_ceiling(engine: Engine) -> float:
    """Bytes/s of batch-1 matmuls over every weight matrix the decode step reads, nothing else
    (through the model's own linear modules, so with the kernels the engine uses)."""
    layers = [m for m in engine.runner.model.modules() if isinstance(m, (torch.nn.Linear, QuantLinear))]
    dtype = engine.runner.dtype
    x = {m.in_features: torch.randn(1, m.in_features, dtype=dtype, device=engine.runner.device) for m in layers}
    nbytes = sum(stored_bytes(m) for m in layers)
    times = []
    with torch.inference_mode():
        for _ in range(8):
            t0 = time.perf_counter()
            for m in layers:
                m(x[m.in_features])
            if engine.config.device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times[2:])


def step_rates(engine: Engine, batch: int, context: int, steps: int) -> tuple[float, float, float]:
    """(intensity, FLOP/s, bytes/s) of the median of `steps` decode forwards at this batch."""
    snaps = decode_steps(Engine(engine.config, runner=engine.runner), batch, context, steps)
    fwd = statistics.median(s.forward_s for s in snaps)
    cost = snaps[len(snaps) // 2].cost
    return cost.intensity, cost.flops / fwd, cost.bytes / fwd


def fraction(peaks: DevicePeaks, intensity: float, flops: float) -> float:
    return flops / peaks.roof(intensity)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="auto")
    ap.add_argument("--weights", default="auto", choices=("auto", "quantized", "dequantized"),
                    help="a GGUF model's weights (batchtop --weights)")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30, help="decode steps timed per batch and round (their median)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    config = resolve_config(model=args.model, weights=args.weights, max_num_seqs=max(batches),
                            max_num_batched_tokens=max(batches) * args.context, num_kv_blocks=4096)
    engine = Engine(config)
    print(f"{config.model.name} ({config.model.num_params() / 1e6:.0f}M, {weights_text(config.model, config.dtype)}, "
          f"{config.dtype}) on {config.device}; context {args.context}")
    steps: dict[int, list[tuple[float, float, float]]] = {b: [] for b in batches}
    for round_ in range(args.rounds):
        peaks = measure_peaks(config.device, config.dtype)
        print(f"round {round_ + 1}: roofs {peaks.roofs_text()}; ridge {peaks.ridge_flop_per_byte:.1f} FLOP/B")
        for batch in batches:
            intensity, flops, bps = step_rates(engine, batch, args.context, args.steps)
            steps[batch].append((intensity, flops, bps))
            bound = "memory" if intensity < peaks.ridge_flop_per_byte else "compute"
            print(f"  batch {batch:>3}: intensity {intensity:6.2f} FLOP/B ({bound}-bound), {flops / 1e9:6.1f} GFLOP/s, "
                  f"{bps / 1e9:5.1f} GB/s: {fraction(peaks, intensity, flops):.2f} of this round's roof", flush=True)
    panel = device_peaks(config.device, config.dtype)
    print(f"the dashboard's roofs (the best this machine was seen to do): {panel.roofs_text()}")
    for batch in batches:
        rates = steps[batch]
        print(f"  batch {batch:>3}: {statistics.median(fraction(panel, i, f) for i, f, _ in rates):.2f} of them "
              f"(median over rounds)")
    ceiling = gemv_ceiling(engine)
    print(f"batch-1 matmuls alone stream weights at {ceiling / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
