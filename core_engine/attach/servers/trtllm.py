"""TensorRT-LLM's `trtllm-serve`: its /metrics answers JSON iteration stats, not Prometheus text;
scrape/trtllm_stats.py reads them and sums the counters attach needs."""

from batchtop.core_engine.attach.servers.family import Knobs, ServerFamily

TRTLLM = "trtllm"

FAMILY = ServerFamily(
    name=TRTLLM, label="TensorRT-LLM", documented="cpp/tensorrt_llm/executor/jsonSerialization.cpp", names=None,
    gaps={"preemptions": "TensorRT-LLM shows preempted requests as paused (numPausedRequests), not as a counter",
          "ttft": "trtllm-serve's /metrics has no latency histograms",
          "lengths": "trtllm-serve's /metrics has no per-request length histograms",
          "tokens": "TensorRT-LLM's rates are summed from its iteration stats since attach began"},
    knobs=Knobs("--max_batch_size", "--max_num_tokens", "a higher --kv_cache_free_gpu_memory_fraction"))
