"""Loading one model directory: batchtop's loader against transformers' from_pretrained, time and peak RSS.

Both load the same directory (the cpu-demo export by default, float32 on disk) into bfloat16 on the
CPU, each in a fresh process so peak RSS is its own: batchtop checks the headers, allocates the model
once and copies tensor by tensor into place (what `--model DIR` does before the KV pool is made);
transformers runs AutoModelForCausalLM.from_pretrained(dir, dtype=bfloat16). The files are read once
first, so both find them in the page cache; rounds alternate between the two.

"load" is the loader's call alone. When the file's dtype is the model's, transformers may leave the
weights as views of the memory-mapped file, so nothing is read until a forward touches it; "ready"
therefore adds one read of every weight (as the first forward does) and the peak RSS is taken after
it. Peak RSS counts mapped file pages as well as the weights a loader copied.

    python bench/checkpoint_load.py                     # exports cpu-demo to a temp dir first
    python bench/checkpoint_load.py --checkpoint DIR --rounds 5
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOADERS = ("batchtop", "transformers")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def child(loader: str, checkpoint: str, dtype: str) -> None:
    """Runs in a fresh process: import, then load and report (imports are not counted in the time)."""
    import torch
    torch_dtype = getattr(torch, dtype)
    if loader == "batchtop":
        from batchtop.core_engine.model.weights import load_model
        from batchtop.core_engine.model.hf_config import read_model_config

        def load():
            return load_model(read_model_config(checkpoint), "cpu", torch_dtype)
    else:
        from transformers import AutoModelForCausalLM

        def load():
            return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch_dtype)
    before = rss_bytes()
    start = time.perf_counter()
    model = load()
    loaded = time.perf_counter()
    with torch.no_grad():
        for param in model.parameters():  # fault in any weight still only mapped
            param.sum()
    ready = time.perf_counter()
    # per storage: batchtop's state_dict views of one fused tensor (and a tied lm_head) share one
    weights = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                   for t in model.state_dict().values()}.values())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"load_s": loaded - start, "ready_s": ready - start, "rss_before": before, "peak_rss": peak,
                      "weights": weights}))


def run_child(loader: str, checkpoint: Path, dtype: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", loader, "--checkpoint", str(checkpoint),
                          "--dtype", dtype], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkpoint", type=Path, help="a model directory [default: export --model to a temp dir]")
    p.add_argument("--model", default="cpu-demo")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="the loaded model's dtype")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", choices=LOADERS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, str(args.checkpoint), args.dtype)
        return

    work = Path(tempfile.mkdtemp(prefix="batchtop-load-bench-"))
    try:
        checkpoint = args.checkpoint
        if checkpoint is None:
            from batchtop.core_engine.config import preset
            from batchtop.core_engine.model.export import export_checkpoint
            checkpoint = export_checkpoint(work / args.model, preset(args.model), seed=0)
        on_disk = sum(f.stat().st_size for f in checkpoint.glob("*.safetensors"))
        for f in checkpoint.glob("*.safetensors"):  # into the page cache, for both loaders alike
            f.read_bytes()
        runs: dict[str, list[dict]] = {name: [] for name in LOADERS}
        for _ in range(args.rounds):
            for name in LOADERS:
                runs[name].append(run_child(name, checkpoint, args.dtype))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    mib = 1 << 20
    print(f"{checkpoint}: {on_disk / mib:.0f} MiB of safetensors on disk, loaded as {args.dtype}, "
          f"{args.rounds} alternating rounds, a fresh process per load")
    print(f"{'loader':<14}{'load s (median)':>16}{'ready s (best / median)':>26}{'peak RSS MiB':>14}"
          f"{'over imports MiB':>18}{'weights MiB':>13}")
    for name, rs in runs.items():
        ready = [r["ready_s"] for r in rs]
        peak = max(r["peak_rss"] for r in rs)
        over = max(r["peak_rss"] - r["rss_before"] for r in rs)
        print(f"{name:<14}{statistics.median(r['load_s'] for r in rs):>16.2f}{min(ready):>14.2f} / "
              f"{statistics.median(ready):<9.2f}{peak / mib:>14.0f}{over / mib:>18.0f}{rs[0]['weights'] / mib:>13.0f}")
    ours, theirs = (statistics.median(r["ready_s"] for r in runs[n]) for n in LOADERS)
    print(f"median time to ready: batchtop / transformers = {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
