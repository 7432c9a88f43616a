"""The Triton decode kernels timed per layer call on CUDA: the split-KV kernel against the serial one.

    python bench/decode_kernel_timing.py                   # gpu-8b dims, context 256, batch 1 and 64: JSON

As the engine runs them: LAYERS calls, one per layer, each over its own pool, captured in one CUDA
graph (no launch overhead) whose replays torch.cuda events time; L2 is flushed before each replay, so
every layer reads its keys from memory as a real step does. The block tables are as wide as the
engine's (max_model_len / block_size), which caps the split count the same way. Also: the eager time
(back-to-back launches, host overhead included), the bytes of K/V each call reads and the time they
take at the device's bandwidth roof, and the largest difference between the two kernels' outputs.
Imported by bench/gpu_suite.py (its decode_kernel section).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from batchtop.core_engine.config import preset
from batchtop.core_engine.perf.device_peaks import device_peaks
from batchtop.gpu_kernels.triton_decode import choose_num_splits, num_sms, paged_decode_attention_triton
from batchtop.gpu_kernels.triton_decode_serial import paged_decode_attention_serial

GOALS_US = {1: 8.0, 64: 30.0}  # issue 40, gpu-8b at context 256
LAYERS = 32
REPLAYS = 7
L2_FLUSH_BYTES = 256 << 20  # several times any GPU's L2


def layer_pools(batch: int, context: int, heads: int, kv_heads: int, head_dim: int, block_size: int,
                max_model_len: int, layers: int, seed: int = 0):
    """q and a (k, v) pool per layer, each row's blocks scattered, tables padded with a spare block."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    per_row = -(-context // block_size)
    num_blocks = batch * per_row + 1
    pools = [tuple(torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen, device="cuda").bfloat16()
                   for _ in range(2)) for _ in range(layers)]
    order = torch.randperm(num_blocks, generator=gen, device="cuda")
    width = max(per_row, max_model_len // block_size)
    tables = torch.full((batch, width), int(order[-1]), device="cuda")
    tables[:, :per_row] = order[:-1].view(batch, per_row)
    lens = torch.full((batch,), context, device="cuda")
    q = torch.randn(batch, heads, head_dim, generator=gen, device="cuda").bfloat16()
    return q, pools, tables, lens


def time_per_call_us(kernel, q, pools, tables, lens, scale) -> dict:
    def every_layer():
        return [kernel(q, k, v, tables, lens, scale) for k, v in pools]
    every_layer()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        every_layer()
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(REPLAYS):
        flush.zero_()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / len(pools))
    flush.zero_()
    start.record()
    every_layer()
    end.record()
    end.synchronize()
    return {"graph_us": round(statistics.median(samples), 2), "graph_us_min": round(min(samples), 2),
            "eager_us": round(start.elapsed_time(end) * 1e3 / len(pools), 2)}


def decode_kernel_timing(model: str = "gpu-8b", batches: tuple[int, ...] = (1, 64), context: int = 256,
                         block_size: int = 16, max_model_len: int = 8192) -> dict:
    cfg = preset(model)
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = cfg.head_dim
    peak = device_peaks("cuda", "bfloat16").peak_bytes_per_s
    out = {"model": model, "context": context, "block_size": block_size, "layers": LAYERS,
           "sms": num_sms(torch.device("cuda")), "peak_bytes_per_s": peak, "batches": {}}
    for batch in batches:
        q, pools, tables, lens = layer_pools(batch, context, heads, kv_heads, head_dim, block_size, max_model_len,
                                             LAYERS)
        scale = head_dim ** -0.5
        k, v = pools[0]
        diff = (paged_decode_attention_triton(q, k, v, tables, lens, scale).float()
                - paged_decode_attention_serial(q, k, v, tables, lens, scale).float()).abs().max().item()
        kv_bytes = 2 * batch * context * kv_heads * head_dim * 2
        new = time_per_call_us(paged_decode_attention_triton, q, pools, tables, lens, scale)
        old = time_per_call_us(paged_decode_attention_serial, q, pools, tables, lens, scale)
        goal = GOALS_US.get(batch)
        out["batches"][batch] = {
            "splits": choose_num_splits(batch, kv_heads, tables.shape[1], block_size, out["sms"]),
            "split_kv": new, "serial": old, "speedup": round(old["graph_us"] / new["graph_us"], 2),
            "kv_bytes": kv_bytes, "kv_roof_us": round(kv_bytes / peak * 1e6, 2),
            "fraction_of_roof": round(kv_bytes / peak * 1e6 / new["graph_us"], 3),
            "max_abs_diff_vs_serial": diff, "goal_us": goal,
            "meets_goal": None if goal is None else new["graph_us"] <= goal}
        del pools
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpu-8b")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--context", type=int, default=256)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device (torch.cuda.is_available() is False)")
    batches = tuple(int(b) for b in args.batches.split(","))
    print(json.dumps(decode_kernel_timing(args.model, batches, args.context), indent=2))


if __name__ == "__main__":
    main()
