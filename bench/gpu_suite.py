"""One command for a lent GPU: GPU tests, decode sweeps, compare, roofline fractions, vLLM if present.

    python bench/gpu_suite.py -o suite.json                              # on an H200: gpu-1b and gpu-8b
    python bench/gpu_suite.py --device cpu --model tiny -o suite.json    # the same path end to end on a CPU

Sections, each timed and each recorded even when it fails (its error goes into the JSON and the
suite goes on); with -o the JSON is rewritten after every section, so a run cut short keeps what it had:
- decode_kernel: the Triton decode attention per layer call, split-KV vs the serial kernel, at batch 1
  and 64 (gpu-8b dims, context 256, in a CUDA graph, torch.cuda events; bench/decode_kernel_timing.py),
  against issue 40's goals (<= 8 us and <= 30 us).
- prefill_kernel: the Triton varlen paged prefill attention per layer call against torch SDPA (bf16,
  4-D, flash / memory-efficient only), one 2048-token prompt and 8 chunks of 256 after 256 cached
  (gpu-8b dims), with each one's fraction of the bf16 compute roof (bench/prefill_kernel_timing.py).
- tests: pytest on tests/kernels/test_gpu.py, test_triton_decode.py (the interpreter tests, which skip
  where CUDA is present) and test_triton_offline_compile.py (passed / failed / skipped).
- sweep: per model, decode step time at each batch size (CUDA graphs on, as the engine runs), and the
  same at batch 1 and the largest batch with --enforce-eager, so what the graphs buy is measured.
- roofline: per model, at batch 1/8/64/256, achieved bytes/s and FLOP/s over the step and the fraction
  of the roof at that intensity (datasheet roofs on known GPUs, measured on a CPU).
- profile: the top kernels of an eager decode step at batch 1 and 64 on the last model, their share of
  the device time, and kernels per step (bench/gpu_suite_extra.py).
- compare: `batchtop compare` (static vs continuous) on the first model, its JSON.
- compare_held: `batchtop compare` on its default workload (the run that once ended in a CUDA OOM)
  on the first model while another process holds 4 GiB of the GPU: exit code, speedup, how each
  run's KV pool was sized.
- calibration: `batchtop calibrate` on the first model (the what-if model's four constants fitted to
  this device's decode steps at contexts 128 and 512), also written beside -o as SUITE.calibration.json
  for `--calibration`.
- hf_peer: transformers' continuous batching on the same device, dims and weights (bench/peer_hf.py,
  256 requests, 64 slots), tok/s beside batchtop's.
- vllm: bench/peer_vllm.py's throughput mode when this Python imports vllm; else why not.
Sized to finish within 8 minutes on an H200 (weights are seeded on the device; 6 steps a batch).
--sections runs some of them only (a rerun of what a cut-short run missed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.perf.decode_sweep import decode_steps
from batchtop.core_engine.perf.device_peaks import device_peaks
from batchtop.core_engine.run.resolve import resolve_config
from gpu_suite_extra import run_compare_beside_held_memory, run_hf_peer, run_profile

ROOT = Path(__file__).resolve().parent.parent
ROOFLINE_BATCHES = (1, 8, 64, 256)
SECTIONS = ("decode_kernel", "prefill_kernel", "tests", "sweep", "roofline", "profile", "compare", "compare_held",
            "calibration", "hf_peer", "vllm")
TESTS = ("tests/kernels/test_gpu.py", "tests/kernels/test_triton_decode.py", "tests/kernels/test_triton_prefill.py",
         "tests/kernels/test_triton_offline_compile.py")


def save(report: dict, path: Path | None) -> None:
    """The report so far, replacing the file whole (a run killed mid-write leaves the previous one)."""
    if path is not None:
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(report, indent=2))
        os.replace(partial, path)


def section(report: dict, name: str, fn, output: Path | None = None) -> None:
    t0 = time.perf_counter()
    try:
        report[name] = fn()
    except Exception as exc:  # noqa: BLE001 - one broken section must not hide the others' numbers
        report[name] = {"error": f"{type(exc).__name__}: {exc}"}
    report[name + "_s"] = round(time.perf_counter() - t0, 1)
    save(report, output)
    print(f"{name}: {time.perf_counter() - t0:.0f} s  {json.dumps(report[name])[:300]}", file=sys.stderr, flush=True)


def run_decode_kernel(device: str) -> dict:
    if device != "cuda":
        return {"skipped": "the Triton kernels are timed on CUDA only"}
    from decode_kernel_timing import decode_kernel_timing  # bench/
    return decode_kernel_timing()


def run_prefill_kernel(device: str) -> dict:
    if device != "cuda":
        return {"skipped": "the Triton kernels are timed on CUDA only"}
    from prefill_kernel_timing import prefill_kernel_timing  # bench/
    return prefill_kernel_timing()


def run_tests(timeout: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", *TESTS],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", proc.stdout)}
    return {"returncode": proc.returncode, **counts, "tail": proc.stdout.strip().splitlines()[-8:]}


def sweep_model(model: str, device: str, batches: list[int], context: int, steps: int) -> dict:
    top = max(batches)
    config = resolve_config(model=model, device=device, max_num_seqs=top, max_num_batched_tokens=top * context,
                            num_kv_blocks=top * (-(-(context + steps + 8) // 16)) + 16)
    peaks = device_peaks(config.device, config.dtype)
    out = {"model": model, "dtype": config.dtype, "params": config.model.num_params(), "context": context,
           "peaks": peaks.as_dict(), "batches": {}}
    runners = {"graphs": Engine(config).runner}
    runners["eager"] = Engine(config.with_(enforce_eager=True), runner=None).runner if device == "cuda" else None
    out["graphs_captured"] = runners["graphs"].graphs is not None
    for batch in batches:
        snaps = decode_steps(Engine(config.with_(max_num_seqs=batch), runner=runners["graphs"]), batch, context, steps)
        step = statistics.median(s.step_time_s for s in snaps)
        fwd = statistics.median(s.forward_s for s in snaps)
        cost = snaps[len(snaps) // 2].cost
        row = {"step_ms": 1e3 * step, "forward_ms": 1e3 * fwd, "tok_s": batch / step,
               "intensity": cost.intensity, "bytes_per_s": cost.bytes / fwd, "flop_per_s": cost.flops / fwd,
               "fraction_of_roof": cost.flops / fwd / peaks.roof(cost.intensity),
               "fraction_of_bandwidth": cost.bytes / fwd / peaks.peak_bytes_per_s}
        if runners["eager"] is not None and batch in (1, top):
            eager = decode_steps(Engine(config.with_(max_num_seqs=batch, enforce_eager=True), runner=runners["eager"]),
                                 batch, context, steps)
            row["eager_step_ms"] = 1e3 * statistics.median(s.step_time_s for s in eager)
        out["batches"][batch] = row
    del runners
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def roofline(sweeps: list[dict]) -> dict:
    return {s["model"]: {b: {k: s["batches"][b][k] for k in ("intensity", "fraction_of_roof", "fraction_of_bandwidth")}
                         for b in ROOFLINE_BATCHES if b in s["batches"]}
            for s in sweeps if "batches" in s}


def run_compare(model: str, device: str, timeout: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="batchtop-suite-") as tmp:
        out = Path(tmp) / "compare.json"
        proc = subprocess.run([sys.executable, "-m", "batchtop.tui", "compare", "--model", model, "--device", device,
                               "--workload", "synthetic", "--num-requests", "128" if device == "cuda" else "16",
                               "--output-mean", "64" if device == "cuda" else "8", "-o", str(out)],
                              cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if proc.returncode:
            return {"returncode": proc.returncode, "stderr": proc.stderr.strip().splitlines()[-5:]}
        return json.loads(out.read_text())


def run_calibrate(model: str, device: str, timeout: int) -> dict:
    """`batchtop calibrate` on this device: the what-if model's constants for `--simulate --calibration`."""
    with tempfile.TemporaryDirectory(prefix="batchtop-suite-") as tmp:
        out = Path(tmp) / "calibration.json"
        proc = subprocess.run([sys.executable, "-m", "batchtop.tui", "calibrate", "--model", model, "--device", device,
                               "--batches", "1,8,32" if device == "cpu" else "1,16,64,256", "--steps", "6",
                               "-o", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if proc.returncode:
            return {"returncode": proc.returncode, "stderr": proc.stderr.strip().splitlines()[-5:]}
        return json.loads(out.read_text())


def run_vllm(model: str, timeout: int) -> dict:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return {"skipped": "vllm is not installed in this Python"}
    with tempfile.TemporaryDirectory(prefix="batchtop-suite-") as tmp:
        out = Path(tmp) / "vllm.json"
        proc = subprocess.run([sys.executable, "bench/peer_vllm.py", "--mode", "throughput", "--model", model,
                               "--vllm-python", sys.executable, "--dtypes", "bfloat16", "--rounds", "2",
                               "--slots", "64", "--num-requests", "256", "--output-mean", "64", "--json", str(out)],
                              cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if proc.returncode or not out.exists():
            return {"returncode": proc.returncode, "stderr": proc.stderr.strip().splitlines()[-5:]}
        return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--model", action="append", help="repeatable [default: gpu-1b and gpu-8b]")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset [default: all]")
    ap.add_argument("-o", "--output", type=Path, help="the JSON, rewritten after each section [default: stdout]")
    args = ap.parse_args()
    chosen = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        ap.error(f"--sections: unknown {', '.join(unknown)} (choose from {', '.join(SECTIONS)})")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here; run with --device cpu --model tiny to check the suite itself")
    models = args.model or ["gpu-1b", "gpu-8b"]
    batches = [int(b) for b in args.batches.split(",")]
    report: dict = {"format": "batchtop.gpu_suite/1", "device": args.device, "torch": torch.__version__,
                    "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"}
    t0 = time.perf_counter()
    out = args.output
    if "decode_kernel" in chosen:
        section(report, "decode_kernel", lambda: run_decode_kernel(args.device), out)
    if "prefill_kernel" in chosen:
        section(report, "prefill_kernel", lambda: run_prefill_kernel(args.device), out)
    if "tests" in chosen:
        section(report, "tests", lambda: run_tests(240), out)
    sweeps: list[dict] = []
    for model in models if "sweep" in chosen else []:
        section(report, f"sweep_{model}",
                lambda m=model: sweep_model(m, args.device, batches, args.context, args.steps), out)
        sweeps.append(report[f"sweep_{model}"])
    if "roofline" in chosen:
        section(report, "roofline", lambda: roofline(sweeps), out)
    if "profile" in chosen:
        section(report, "profile", lambda: run_profile(models[-1], args.device), out)
    if "compare" in chosen:
        section(report, "compare", lambda: run_compare(models[0], args.device, 240), out)
    if "compare_held" in chosen:
        section(report, "compare_held", lambda: run_compare_beside_held_memory(models[0], args.device, 240), out)
    if "calibration" in chosen:
        section(report, "calibration", lambda: run_calibrate(models[0], args.device, 240), out)
    if "hf_peer" in chosen:
        section(report, "hf_peer", lambda: run_hf_peer(models[0], args.device, 240), out)
    if "vllm" in chosen:
        section(report, "vllm", lambda: run_vllm(models[0], 300), out)
    report["total_s"] = round(time.perf_counter() - t0, 1)
    save(report, out)
    if out is None:
        print(json.dumps(report, indent=2))
    elif report.get("calibration", {}).get("schema"):  # ready for `batchtop --simulate DEVICE --calibration FILE`
        out.with_suffix(".calibration.json").write_text(json.dumps(report["calibration"], indent=2))


if __name__ == "__main__":
    main()
