"""How close decode steps come to this device's roofs, at batch 1 and batch 32.

    python bench/roofline.py [--model cpu-demo] [--context 256]

Measures the device's peaks fresh (copy bandwidth, GEMM FLOP/s in the model dtype), then runs real
decode steps at batch 1 and 32 and prints, for each: arithmetic intensity, achieved FLOP/s and
bytes/s over the forward's time, and the fraction of the roof at that intensity. Batch 1 sits on
the memory roof; the target is >= 70% of the measured copy bandwidth there. It also times the
weight GEMVs alone (streaming every layer's weights once, no attention, no Python around them) to
show the ceiling the matmul kernels themselves impose.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from batchtop.core_engine.device import DTYPES
from batchtop.core_engine.perf.device_peaks import measure_peaks
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.run.resolve import resolve_config
from batchtop.core_engine.perf.decode_sweep import decode_steps


def gemv_ceiling(engine: Engine) -> float:
    """Bytes/s of batch-1 matmuls over every weight matrix the decode step reads, nothing else
    (through the model's own linear modules, so with the kernels the engine uses)."""
    layers = [m for m in engine.runner.model.modules() if isinstance(m, torch.nn.Linear)]
    x = {m.in_features: torch.randn(1, m.in_features, dtype=m.weight.dtype, device=m.weight.device) for m in layers}
    nbytes = sum(m.weight.numel() * m.weight.element_size() for m in layers)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="auto")
    ap.add_argument("--context", type=int, default=256)
    args = ap.parse_args()
    config = resolve_config(model=args.model, max_num_seqs=32, max_num_batched_tokens=32 * args.context,
                            num_kv_blocks=4096)
    engine = Engine(config)
    peaks = measure_peaks(config.device, config.dtype)
    print(f"{config.model.name} ({config.model.num_params() / 1e6:.0f}M, {config.dtype}) on {peaks.device_name}")
    print(f"measured roofs: {peaks.peak_flops / 1e9:.0f} GFLOP/s ({config.dtype} GEMM), "
          f"{peaks.peak_bytes_per_s / 1e9:.1f} GB/s (copy, read + write); ridge {peaks.ridge_flop_per_byte:.1f} FLOP/B")
    for batch in (1, 32):
        snaps = decode_steps(Engine(config, runner=engine.runner), batch, args.context, 10)
        fwd = statistics.median(s.forward_s for s in snaps)
        cost = snaps[len(snaps) // 2].cost
        flops, bps = cost.flops / fwd, cost.bytes / fwd
        roof = peaks.roof(cost.intensity)
        bound = "memory" if cost.intensity < peaks.ridge_flop_per_byte else "compute"
        print(f"batch {batch:>2}: forward {1e3 * fwd:6.1f} ms, intensity {cost.intensity:6.2f} FLOP/B ({bound}-bound), "
              f"{flops / 1e9:6.1f} GFLOP/s, {bps / 1e9:5.1f} GB/s = {100 * bps / peaks.peak_bytes_per_s:4.0f}% of copy "
              f"bandwidth, {100 * flops / roof:4.0f}% of the roof at this intensity")
    ceiling = gemv_ceiling(engine)
    print(f"batch-1 matmuls alone stream weights at {ceiling / 1e9:.1f} GB/s = "
          f"{100 * ceiling / peaks.peak_bytes_per_s:.0f}% of copy bandwidth (the kernels' own ceiling, "
          f"{DTYPES[config.dtype]})")


if __name__ == "__main__":
    main()
