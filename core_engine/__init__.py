"""batchtop's engine: a real paged-KV continuous batcher. Imports no UI library."""

import os

# Every decode step streams all the weights and much of the KV pool. On 2 MiB pages instead of 4 KiB
# the TLB covers them: cpu-demo runs the bench/peer_vllm.py workload 3-6% faster on the CPU here. torch
# reads this once, at its first large allocation, so it is set before any; a user's own value wins, and
# a host with transparent huge pages off ignores it.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
