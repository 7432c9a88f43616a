"""The split-KV decode kernels compiled for an H100/H200 (sm_90) on a machine without a GPU: ptxas must
keep every value in registers (no spills) and the decode kernel's dots must be tensor-core `mma`s.

The compile runs in a subprocess: this test process imported Triton for the interpreter
(tests/support/triton_interpreter.py), which replaces the compiler.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from batchtop.gpu_kernels import triton_decode

pytestmark = [pytest.mark.slow,  # a compile in a fresh process: about 10 s
              pytest.mark.skipif(not triton_decode.available(), reason="triton is not installed")]


def compile_offline(tmp_path, *args: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), TRITON_DEFAULT_FP_FUSION="1")
    proc = subprocess.run([sys.executable, "-m", "batchtop.gpu_kernels.triton_offline_compile", *args],
                          capture_output=True, text=True, env=env, timeout=240)
    if proc.returncode == 3:
        pytest.skip(json.loads(proc.stdout)["error"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_the_gpu_8b_decode_kernels_compile_for_sm90_on_tensor_cores_without_spills(tmp_path):
    results = compile_offline(tmp_path, "--arch", "90", "--batches", "1,64")  # Llama-3-8B dims, bf16
    by_shape = {(r["batch"], r["kernel"]): r for r in results}
    assert set(by_shape) == {(1, "_split_kernel"), (1, "_merge_kernel"), (64, "_split_kernel")}, \
        "batch 1 splits the keys (and merges), batch 64 fills the GPU with one split"
    assert by_shape[1, "_split_kernel"]["grid"] == [1, 8, 17]
    for r in results:
        assert 0 < r["registers"] <= 255, r
        assert r["spill_stores"] == r["spill_loads"] == 0, r
    for batch in (1, 64):
        mma = by_shape[batch, "_split_kernel"]["mma"]
        assert any("bf16" in op for op in mma), f"no bf16 tensor-core instruction in the decode kernel: {mma}"


def test_the_gpu_8b_prefill_kernel_compiles_for_sm90_on_tensor_cores_without_spills(tmp_path):
    results = compile_offline(tmp_path, "--arch", "90", "--kernels", "prefill")  # 32 heads, 8 KV heads, hd 128
    by_shape = {r["chunks"]: r for r in results}
    assert set(by_shape) == {"1x2048+0", "8x256+256"} and {r["kernel"] for r in results} == {"_prefill_kernel"}
    # 128 dot rows = 32 query rows x the 4 heads of a KV head: 2048 // 32 tiles + one spare per chunk
    assert by_shape["1x2048+0"]["grid"] == [65, 8] and by_shape["8x256+256"]["grid"] == [72, 8]
    for r in results:
        assert 0 < r["registers"] <= 255, r
        assert r["spill_stores"] == r["spill_loads"] == 0, r
        assert any("bf16" in op for op in r["mma"]), f"no bf16 tensor-core instruction in prefill: {r['mma']}"
