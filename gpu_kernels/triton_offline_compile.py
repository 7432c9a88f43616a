"""Compile the split-KV decode kernels for an NVIDIA GPU on a machine without one, and report what
ptxas made of them: registers, spills, shared memory, and whether the code runs on tensor cores.

    python -m batchtop.gpu_kernels.triton_offline_compile [--arch 90] [--batches 1,64] ...   # prints JSON

The launches come from triton_decode.plan on meta tensors, so the signatures (dtypes, which integers
are multiples of 16, the constexprs) are the ones a real call at those shapes specialises. Must run
without TRITON_INTERPRET (the interpreter replaces the compiler). Prints {"error": ...} and exits 3
where this Triton cannot compile offline (no NVIDIA backend, no ptxas).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import torch

_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int64: "i64",
          torch.int32: "i32"}


def signature(kernel, args: tuple, constexprs: dict) -> tuple[dict, dict]:
    """Triton's signature and attributes for these arguments, as its launcher would specialise them:
    tensors become typed pointers (meta tensors count as 16-byte aligned), integers that are multiples
    of 16 get tt.divisibility 16."""
    sig, attrs = {}, {}
    for index, (name, value) in enumerate(zip(kernel.arg_names, (*args, *constexprs.values()))):
        if name in constexprs:
            sig[name] = "constexpr"
        elif isinstance(value, torch.Tensor):
            sig[name], attrs[(index,)] = "*" + _TYPES[value.dtype], [["tt.divisibility", 16]]
        elif isinstance(value, float):
            sig[name] = "fp32"
        else:
            sig[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
    return sig, attrs


def ptxas_report(ptx: str, arch: int) -> dict:
    """ptxas -v on the PTX, with the ptxas Triton itself uses for this arch."""
    from triton.backends.nvidia import compiler as nvidia
    try:
        ptxas = nvidia.get_ptxas(arch).path
    except TypeError:  # Triton < 3.4: one ptxas for every arch
        ptxas = nvidia.get_ptxas().path
    with tempfile.TemporaryDirectory(prefix="batchtop-ptx-") as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        gpu = nvidia.sm_arch_from_capability(arch)
        proc = subprocess.run([ptxas, "-v", f"--gpu-name={gpu}", src, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True, check=True)
    log = proc.stderr

    def number(pattern: str) -> int:
        found = re.search(pattern, log)
        return int(found.group(1)) if found else 0
    return {"registers": number(r"Used (\d+) registers"), "spill_stores": number(r"(\d+) bytes spill stores"),
            "spill_loads": number(r"(\d+) bytes spill loads"), "stack_frame": number(r"(\d+) bytes stack frame"),
            "ptxas_log": log.strip().splitlines()[-3:]}


def compile_plan(launches, arch: int) -> list[dict]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from batchtop.gpu_kernels.triton_decode_kernels import jit
    results = []
    for launch in launches:
        kernel = jit(launch.kernel)
        sig, attrs = signature(kernel, launch.args, launch.constexprs)
        compiled = triton.compile(ASTSource(kernel, sig, launch.constexprs, attrs), target=GPUTarget("cuda", arch, 32))
        ptx = compiled.asm["ptx"]
        results.append({"kernel": launch.kernel.__name__, "grid": list(launch.grid),
                        "constexprs": {k: v for k, v in launch.constexprs.items()},
                        "num_warps": compiled.metadata.num_warps, "num_stages": compiled.metadata.num_stages,
                        "shared_bytes": compiled.metadata.shared,
                        "mma": sorted(set(re.findall(r"\b(w?mma(?:\.\w+)+)", ptx))),
                        **ptxas_report(ptx, arch)})
    return results


def decode_plan(batch: int, heads: int, kv_heads: int, head_dim: int, block_size: int, context: int,
                dtype: torch.dtype, sms: int):
    from batchtop.gpu_kernels.triton_decode import choose_num_splits, plan
    meta = {"device": "meta"}
    width = -(-context // block_size)
    q = torch.empty(batch, heads, head_dim, dtype=dtype, **meta)
    cache = torch.empty(batch * width + 1, block_size, kv_heads, head_dim, dtype=dtype, **meta)
    tables = torch.empty(batch, width, dtype=torch.int64, **meta)
    lens = torch.empty(batch, dtype=torch.int64, **meta)
    splits = choose_num_splits(batch, kv_heads, width, block_size, sms)
    return plan(q, cache, cache, tables, lens, head_dim ** -0.5, splits)[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 [default: 90, an H100/H200]")
    ap.add_argument("--sms", type=int, default=132, help="SMs the split count is chosen for [default: 132]")
    ap.add_argument("--batches", default="1,64", help="comma-separated batch sizes [default: 1,64]")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--context", type=int, default=8192, help="the table width, in tokens [default: 8192]")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("triton_offline_compile: unset TRITON_INTERPRET (the interpreter replaces the compiler)")
    try:
        results = [{"batch": int(batch), **result} for batch in args.batches.split(",")
                   for result in compile_plan(decode_plan(int(batch), args.heads, args.kv_heads, args.head_dim,
                                                          args.block_size, args.context, getattr(torch, args.dtype),
                                                          args.sms), args.arch)]
    except (ImportError, AttributeError, TypeError, OSError, subprocess.CalledProcessError) as exc:
        detail = (exc.stderr or "").strip()[-500:] if isinstance(exc, subprocess.CalledProcessError) else ""
        print(json.dumps({"error": f"this Triton cannot compile for sm_{args.arch} offline: "
                                   f"{type(exc).__name__}: {exc} {detail}".strip()}))
        sys.exit(3)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
