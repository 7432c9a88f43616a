"""bench/gpu_suite.py's sections that look past the step time: where a decode step's time goes by
kernel, static batching's compare while another process holds GPU memory, and transformers'
continuous batching as a peer on the same device."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.perf.decode_sweep import sweep_prompt
from batchtop.core_engine.run.resolve import resolve_config
from batchtop.core_engine.sched.request import Request

ROOT = Path(__file__).resolve().parent.parent
TOP_KERNELS = 12


def run_profile(model: str, device: str, batches=(1, 64), context: int = 256, steps: int = 3) -> dict:
    """The top kernels of an eager decode step (a replayed CUDA graph hides its kernels from the
    profiler), their share of the device time, and how many kernels one step launches."""
    top = max(batches)
    config = resolve_config(model=model, device=device, max_num_seqs=top, max_num_batched_tokens=top * context,
                            num_kv_blocks=top * (-(-(context + 2 * steps + 8) // 16)) + 16).with_(enforce_eager=True)
    runner = Engine(config).runner
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    out = {"model": model, "context": context, "eager": True, "batches": {}}
    for batch in batches:
        engine = Engine(config.with_(max_num_seqs=batch), runner=runner)
        engine.load_workload([Request(f"p{batch}-{i}", sweep_prompt(engine, context, i), 2 * steps + 4)
                              for i in range(batch)])
        while not engine.is_done():  # prompts and a first decode step, unprofiled
            snap = engine.step()
            if snap.is_step and snap.num_prefill_tokens == 0 and snap.num_seqs == batch:
                break
        with torch.profiler.profile(activities=activities) as prof:
            snaps = [engine.step() for _ in range(steps)]
        decode = [s for s in snaps if s.is_step and s.num_prefill_tokens == 0 and s.num_seqs == batch]
        times: Counter[str] = Counter()
        launches = 0
        if device == "cuda":  # kernels on the device
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    times[e.name] += e.device_time_total
                    launches += 1
        else:  # no device: the operators by their own CPU time
            for e in prof.key_averages():
                times[e.key] += e.self_cpu_time_total
                launches += e.count
        total = sum(times.values()) or 1
        out["batches"][batch] = {
            "steps_profiled": len(snaps), "decode_steps": len(decode),
            ("kernels_per_step" if device == "cuda" else "ops_per_step"): round(launches / max(1, len(snaps)), 1),
            "top": [{"name": name[:120], "share": round(t / total, 3), "us_per_step": round(t / len(snaps), 1)}
                    for name, t in times.most_common(TOP_KERNELS)],
        }
    del runner
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def run_compare_beside_held_memory(model: str, device: str, timeout: int, hold_gib: float = 4.0) -> dict:
    """`batchtop compare` on its default workload (static, then continuous: the run that ended in a
    CUDA OOM) while another process holds hold_gib of the GPU: the pool is sized around it, and no
    forward may run out of memory."""
    holder = None
    if device == "cuda":
        code = (f"import torch, sys, time; x = torch.empty({int(hold_gib * (1 << 30))}, dtype=torch.uint8, "
                "device='cuda'); print('held', flush=True); time.sleep(3600)")
        holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        if holder.stdout.readline().strip() != "held":
            holder.kill()
            return {"error": "the holder process could not allocate its memory"}
    try:
        with tempfile.TemporaryDirectory(prefix="batchtop-suite-") as tmp:
            out = Path(tmp) / "compare.json"
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "batchtop.tui", "compare", "--model", model, "--device",
                                   device, "--num-requests", "128" if device == "cuda" else "8", "-o", str(out)],
                                  cwd=ROOT, capture_output=True, text=True, timeout=timeout)
            result = {"held_gib": hold_gib if holder else 0, "returncode": proc.returncode,
                      "wall_s": round(time.perf_counter() - t0, 1),
                      "stderr_tail": proc.stderr.strip().splitlines()[-6:]}
            if proc.returncode == 0:
                doc = json.loads(out.read_text())
                result.update(speedup=doc["speedup"],
                              kv_pool={m: doc[m]["config"].get("kv_pool") for m in ("static", "continuous")},
                              num_kv_blocks={m: doc[m]["config"]["num_kv_blocks"] for m in ("static", "continuous")})
            return result
    finally:
        if holder is not None:
            holder.kill()


def run_hf_peer(model: str, device: str, timeout: int) -> dict:
    """transformers' continuous batching on the same device, model dims, weights and workload
    (bench/peer_hf.py: 256 requests, 64 slots on a GPU)."""
    with tempfile.TemporaryDirectory(prefix="batchtop-suite-") as tmp:
        out = Path(tmp) / "hf.json"
        size = ["--num-requests", "256", "--max-batch", "64", "--max-batched-tokens", "2048",
                "--num-kv-blocks", "8192"] if device == "cuda" else ["--num-requests", "4", "--max-batch", "4",
                                                                     "--num-kv-blocks", "64"]
        proc = subprocess.run([sys.executable, "bench/peer_hf.py", "--model", model, "--device", device, *size,
                               "--repeats", "1", "--skip-static", "--json", str(out)],
                              cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if proc.returncode or not out.exists():
            return {"returncode": proc.returncode, "stderr": proc.stderr.strip().splitlines()[-5:]}
        return json.loads(out.read_text())
