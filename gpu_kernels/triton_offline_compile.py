"""Compile the split-KV decode kernels (and the varlen prefill kernel) for an NVIDIA GPU on a machine
without one, and report what ptxas made of them: registers, spills, shared memory, and whether the code
runs on tensor cores.

    python -m batchtop.gpu_kernels.triton_offline_compile [--arch 90] [--batches 1,64] ...   # prints JSON
    python -m batchtop.gpu_kernels.triton_offline_compile --kernels prefill   # one 2048-token prompt; 8 x 256 after 256

The launches come from triton_decode.plan / triton_prefill.plan on meta tensors, so the signatures
(dtypes, which integers are multiples of 16 or equal 1, the constexprs) are the ones a real call at those
shapes specialises. Must run without TRITON_INTERPRET (the interpreter replaces the compiler). Prints
{"error": ...} and exits 3 where this Triton cannot compile offline (no NVIDIA backend, no ptxas).
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


def specialise_ones(sig: dict, constexprs: dict, kernel, args: tuple) -> tuple[dict, dict]:
    """Triton's launcher makes an integer argument equal to 1 a constant; so does this compile."""
    sig, constexprs = dict(sig), dict(constexprs)
    for name, value in zip(kernel.arg_names, args):
        if sig.get(name) in ("i32", "i64") and value == 1:
            sig[name], constexprs[name] = "constexpr", 1
    return sig, constexprs


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
        sig, constants = specialise_ones(sig, launch.constexprs, kernel, launch.args)
        compiled = triton.compile(ASTSource(kernel, sig, constants, attrs), target=GPUTarget("cuda", arch, 32),
                                  options=getattr(launch, "options", None))
        ptx = compiled.asm["ptx"]
        results.append({"kernel": launch.kernel.__name__, "grid": list(launch.grid),
                        "constexprs": {k: v for k, v in launch.constexprs.items()},
                        "num_warps": compiled.metadata.num_warps, "num_stages": compiled.metadata.num_stages,
                        "shared_bytes": compiled.metadata.shared,
                        "mma": sorted(set(re.findall(r"\b((?:wgmma\.mma_async|w?mma)(?:\.\w+)+)", ptx))),
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


PREFILL_SHAPES = {"1x2048+0": ([2048], [0]), "8x256+256": ([256] * 8, [256] * 8)}  # rows, cached per chunk


def prefill_plan(rows: list[int], contexts: list[int], heads: int, kv_heads: int, head_dim: int, block_size: int,
                 dtype: torch.dtype):
    """The prefill launch for chunks of these rows after these cached tokens; q a view of the fused qkv."""
    from batchtop.gpu_kernels.triton_prefill import plan
    meta = {"device": "meta"}
    width = max(-(-(c + n) // block_size) for c, n in zip(contexts, rows))
    q = torch.empty(sum(rows), heads + 2 * kv_heads, head_dim, dtype=dtype, **meta)[:, :heads]
    cache = torch.empty(len(rows) * width + 1, block_size, kv_heads, head_dim, dtype=dtype, **meta)
    tables = torch.empty(len(rows), width, dtype=torch.int32, **meta)
    starts = torch.empty(len(rows) + 1, dtype=torch.int32, **meta)
    context_starts = torch.empty(len(rows), dtype=torch.int32, **meta)
    return [plan(q, cache, cache, tables, starts, context_starts, head_dim ** -0.5)[1]]


FUSED_ROWS = (1, 2048)  # a decode step of one row; a prefill chunk


def fused_plan(rows: int, heads: int, kv_heads: int, head_dim: int, hidden: int, intermediate: int, block_size: int,
               dtype: torch.dtype) -> list:
    """triton_fused's three launches for `rows` tokens of a model with these dims (qk a view of the fused qkv)."""
    from batchtop.gpu_kernels import triton_fused
    meta = {"device": "meta"}
    x = torch.empty(rows, hidden, dtype=dtype, **meta)
    qkv = torch.empty(rows, heads + 2 * kv_heads, head_dim, dtype=dtype, **meta)
    cache = torch.empty(rows // block_size + 2, block_size, kv_heads, head_dim, dtype=dtype, **meta)
    table = torch.empty(8192, head_dim, dtype=torch.float32, **meta)
    index = torch.empty(rows, dtype=torch.int64, **meta)
    return (triton_fused.plan_add_rmsnorm(x, torch.empty_like(x), torch.empty(hidden, dtype=dtype, **meta), 1e-5)
            + triton_fused.plan_rope_and_store_kv(qkv[:, :heads + kv_heads], qkv[:, heads + kv_heads:], table, index,
                                                  cache, cache, index, heads)
            + triton_fused.plan_silu_mul(torch.empty(rows, 2 * intermediate, dtype=dtype, **meta))[1])


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
    ap.add_argument("--hidden", type=int, default=4096, help="hidden size, for the fused kernels [default: 4096]")
    ap.add_argument("--intermediate", type=int, default=14336, help="MLP width, for silu_mul [default: 14336]")
    ap.add_argument("--kernels", default="decode",
                    help="comma-separated: decode (at --batches), prefill (at " + ", ".join(PREFILL_SHAPES) + "), "
                         "fused (triton_fused's elementwise kernels at " + ", ".join(map(str, FUSED_ROWS)) + " rows)")
    args = ap.parse_args()
    kinds = [k.strip() for k in args.kernels.split(",") if k.strip()]
    if not kinds or set(kinds) - {"decode", "prefill", "fused"}:
        ap.error(f"--kernels: {args.kernels!r}: choose from decode, prefill, fused")
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("triton_offline_compile: unset TRITON_INTERPRET (the interpreter replaces the compiler)")
    dtype = getattr(torch, args.dtype)
    try:
        results = [{"batch": int(batch), **result} for batch in args.batches.split(",") if "decode" in kinds
                   for result in compile_plan(decode_plan(int(batch), args.heads, args.kv_heads, args.head_dim,
                                                          args.block_size, args.context, dtype, args.sms), args.arch)]
        results += [{"chunks": shape, **result} for shape, (rows, contexts) in PREFILL_SHAPES.items()
                    if "prefill" in kinds
                    for result in compile_plan(prefill_plan(rows, contexts, args.heads, args.kv_heads, args.head_dim,
                                                            args.block_size, dtype), args.arch)]
        results += [{"rows": rows, **result} for rows in FUSED_ROWS if "fused" in kinds
                    for result in compile_plan(fused_plan(rows, args.heads, args.kv_heads, args.head_dim, args.hidden,
                                                          args.intermediate, args.block_size, dtype), args.arch)]
    except (ImportError, AttributeError, TypeError, OSError, subprocess.CalledProcessError) as exc:
        detail = (exc.stderr or "").strip()[-500:] if isinstance(exc, subprocess.CalledProcessError) else ""
        print(json.dumps({"error": f"this Triton cannot compile for sm_{args.arch} offline: "
                                   f"{type(exc).__name__}: {exc} {detail}".strip()}))
        sys.exit(3)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
