"""Reading one replica: the URL it names, its /metrics fetched within a deadline, the answer parsed into
a sample (Prometheus text, TensorRT-LLM's JSON, llama.cpp's /slots), checked for plausibility, and what
changed between two samples."""
