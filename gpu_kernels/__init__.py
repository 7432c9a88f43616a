"""Attention over the paged KV pool: a torch reference for CPU and CUDA. Imports no UI library."""

from batchtop.gpu_kernels.paged_attention import gather_kv, paged_decode_attention, prefill_attention, store_kv

__all__ = ["gather_kv", "paged_decode_attention", "prefill_attention", "store_kv"]
