"""How close decode steps come to this device's roofs, each group of steps against roofs measured around it.

    python bench/roofline.py [--model auto] [--weights auto] [--batches 1,32] [--context 256] [--rounds 3]
                             [--steps 30] [--groups 3]

Each round measures the device's peaks afresh (device_peaks.measure_peaks: a copy and, where batchtop's
CPU kernels run, their GEMM and a 256 MiB GEMV), then runs real decode steps at each batch size in
--groups groups, the memory roof probed again (the same GEMV, best of 7) before each group and after the
last; the steps right after a probe, whose weights it pushed out of the last-level cache, go untimed. It
prints, for each batch: arithmetic intensity, achieved FLOP/s and bytes/s over the forward's time (bytes
as stored: a GGUF's quantized blocks where they run quantized), and the fraction of the roof at that
intensity, each group set against the mean of the memory probes either side of it. A shared
machine's memory bandwidth moves with its neighbours (33 to 70 GB/s on the same 2-core host within an
hour, from one second to the next): a roof measured once before a round's steps was a quiet host's for
steps that ran on a busy one, or the other way round. The roofs the dashboard shows are the best this
machine was ever seen to do (cached), raised by any step of this run that beat them (raised_roofs.py):
printed last with each batch's groups and its fastest step against them (at most 1). It also times the
batch-1 matmuls alone (every weight once, no attention, no Python between them but the module calls):
the ceiling the kernels themselves set.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable

import torch

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.model.quant_linear import QuantLinear
from batchtop.core_engine.model.weight_bytes import weights_text
from batchtop.core_engine.perf.decode_sweep import decode_step_stream
from batchtop.core_engine.perf.device_peaks import DevicePeaks, device_peaks, measure_peaks, probe_mib
from batchtop.core_engine.perf.kernel_peaks import gemv_probe, kernels_in_use
from batchtop.core_engine.perf.raised_roofs import RoofRaiser, step_rates
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


# Steps left unmeasured after each memory probe: its 256 MiB stream empties the last-level cache, which
# between two back-to-back decode steps keeps part of the weights. On a 2-core Zen 4 with a 32 MiB L3,
# the three SmolLM2 Q4_1 steps after a probe took 1.27x, 1.20x and 1.10x as long as the steady ones.
SETTLE_STEPS = 4


@dataclasses.dataclass(frozen=True)
class GroupRates:
    """A group of decode steps: intensity (FLOP/B), FLOP/s and bytes/s of their median forward, and the
    memory roof (bytes/s) probed before and after them."""

    intensity: float
    flops: float
    bytes_per_s: float
    roof_before: float
    roof_after: float

    def fraction(self, peaks: DevicePeaks) -> float:
        """Of the roof at this intensity: peaks' compute roof, the mean of the probes around for memory."""
        around = dataclasses.replace(peaks, peak_bytes_per_s=(self.roof_before + self.roof_after) / 2)
        return self.flops / around.roof(self.intensity)


def group_rates(engine: Engine, batch: int, context: int, steps: int, groups: int,
                memory_probe: Callable[[], float], settle: int = SETTLE_STEPS,
                observe: Callable[[object], object] = lambda snap: None) -> list[GroupRates]:
    """`steps` decode forwards at this batch (rounded down to whole groups) in `groups` groups, the memory
    roof probed between them and `settle` unmeasured steps after each probe; observe: sees every step."""
    size = steps // groups
    rates, group, before, skip = [], [], memory_probe(), settle
    stream = decode_step_stream(Engine(engine.config, runner=engine.runner), batch, context, (size + settle) * groups)
    for snap in stream:
        observe(snap)
        if skip > 0:
            skip -= 1
            continue
        group.append(snap)
        if len(group) == size:
            after = memory_probe()
            fwd = statistics.median(s.forward_s for s in group)
            cost = group[len(group) // 2].cost
            rates.append(GroupRates(cost.intensity, cost.flops / fwd, cost.bytes / fwd, before, after))
            group, before, skip = [], after, settle
    return rates


def between_groups_probe(device: str, dtype: str) -> Callable[[], float]:
    """The memory probe between groups: the kernels' GEMV where they run, else the round's whole probe."""
    if kernels_in_use(device, dtype):
        return gemv_probe(probe_mib())
    return lambda: measure_peaks(device, dtype).peak_bytes_per_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="auto")
    ap.add_argument("--weights", default="auto", choices=("auto", "quantized", "dequantized"),
                    help="a GGUF model's weights (batchtop --weights)")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30, help="decode steps timed per batch and round (their median)")
    ap.add_argument("--groups", type=int, default=3,
                    help="groups a batch's steps are timed in, the memory roof probed before and after each")
    args = ap.parse_args()
    if not 1 <= args.groups <= args.steps:
        ap.error(f"--groups {args.groups}: needs 1 to --steps ({args.steps}) groups")
    batches = [int(b) for b in args.batches.split(",")]
    config = resolve_config(model=args.model, weights=args.weights, max_num_seqs=max(batches),
                            max_num_batched_tokens=max(batches) * args.context, num_kv_blocks=4096)
    engine = Engine(config)
    print(f"{config.model.name} ({config.model.num_params() / 1e6:.0f}M, {weights_text(config.model, config.dtype)}, "
          f"{config.dtype}) on {config.device}; context {args.context}")
    memory_probe = between_groups_probe(config.device, config.dtype)
    panel = RoofRaiser.for_run(device_peaks(config.device, config.dtype), config.device, config.dtype)
    every: dict[int, list[tuple[float, float]]] = {b: [] for b in batches}  # (intensity, FLOP/s) of each step

    def observe(batch: int) -> Callable[[object], None]:
        def seen(snap: object) -> None:
            panel.observe(snap)
            if (rates := step_rates(snap)) is not None:
                every[batch].append((snap.cost.intensity, rates[0]))
        return seen
    groups: dict[int, list[GroupRates]] = {b: [] for b in batches}
    fractions: dict[int, list[float]] = {b: [] for b in batches}
    for round_ in range(args.rounds):
        peaks = measure_peaks(config.device, config.dtype)
        print(f"round {round_ + 1}: roofs {peaks.roofs_text()}; ridge {peaks.ridge_flop_per_byte:.1f} FLOP/B")
        for batch in batches:
            rates = group_rates(engine, batch, args.context, args.steps, args.groups, memory_probe,
                                observe=observe(batch))
            groups[batch] += rates
            round_fractions = [r.fraction(peaks) for r in rates]
            fractions[batch] += round_fractions
            bound = "memory" if rates[0].intensity < peaks.ridge_flop_per_byte else "compute"
            probes = [rates[0].roof_before] + [r.roof_after for r in rates]
            print(f"  batch {batch:>3}: intensity {rates[0].intensity:6.2f} FLOP/B ({bound}-bound), "
                  f"{statistics.median(r.flops for r in rates) / 1e9:6.1f} GFLOP/s, "
                  f"{statistics.median(r.bytes_per_s for r in rates) / 1e9:5.1f} GB/s: "
                  f"{' '.join(f'{f:.2f}' for f in round_fractions)} of the roofs around its groups "
                  f"(memory probed at {' '.join(f'{p / 1e9:.0f}' for p in probes)} GB/s)", flush=True)
    for batch in batches:
        print(f"  batch {batch:>3}: median {statistics.median(fractions[batch]):.2f} of the roofs around its steps "
              f"({len(fractions[batch])} groups, {min(fractions[batch]):.2f}-{max(fractions[batch]):.2f})")
    roofs = panel.peaks
    print(f"the dashboard's roofs (the best this machine was seen to do, raised by this run's steps): "
          f"{roofs.roofs_text()}; compute {panel.compute.text()}; memory {panel.memory.text()}")
    for batch in batches:
        best = statistics.median(r.flops / roofs.roof(r.intensity) for r in groups[batch])
        top = max(flops / roofs.roof(intensity) for intensity, flops in every[batch])
        print(f"  batch {batch:>3}: {best:.2f} of them (median over groups); every step at most {top:.2f} "
              f"({len(every[batch])} steps)")
    ceiling = gemv_ceiling(engine)
    print(f"batch-1 matmuls alone stream weights at {ceiling / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
