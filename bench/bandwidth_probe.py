"""What a one-row bf16 GEMV streams a weight at, by the weight's size against the last-level cache.

    python bench/bandwidth_probe.py [--threads 2] [--sizes 16,32,64,128,256] [--rounds 3]

The memory roof a CPU run is measured against comes from this GEMV (core_engine/perf/kernel_peaks.py)
and a copy. A weight the last-level cache holds streams at the cache's rate, and one a little larger
than the cache still finds part of itself there on the next pass; a model's 270 MB of weights do not.
Each round times every size once (best of 7 runs each, as kernel_peaks does), so a noisy neighbour
hits them all; the rate stops falling where no cache serves the stream any more, and that is the size
device_peaks.probe_mib() must reach.
"""

from __future__ import annotations

import argparse

import torch

from batchtop.core_engine.perf.device_peaks import last_level_cache_bytes, probe_mib
from batchtop.core_engine.perf.kernel_peaks import gemv_probe
from batchtop.gpu_kernels import cpu_kernels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sizes", default="16,32,64,128,256", help="weights in MiB, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not cpu_kernels.linear_bf16_usable():
        raise SystemExit("bandwidth_probe: needs batchtop's bf16 CPU kernels (AVX512_BF16)")
    probes = {mib: gemv_probe(mib) for mib in (int(s) for s in args.sizes.split(","))}
    llc = last_level_cache_bytes()
    print(f"{args.threads} thread(s); last-level cache {llc / (1 << 20) if llc else '?'} MiB; "
          f"the roof's probe streams {probe_mib()} MiB")
    for r in range(args.rounds):
        rates = [f"{mib:4d} MiB {probe() / 1e9:6.1f} GB/s" for mib, probe in probes.items()]
        print(f"round {r + 1}: " + "   ".join(rates), flush=True)


if __name__ == "__main__":
    main()
