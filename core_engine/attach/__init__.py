"""batchtop attach: the console over live inference servers (vLLM, SGLang, TGI, llama.cpp, LMDeploy,
NIM, TensorRT-LLM, batchtop serve), read from their /metrics.

servers/ holds one record per server family; scrape/ reads one replica; watch.py is the watch loop
that feeds monitor.py, whose frame (stats, aggregate, history, verdict/, readings) every front end
shows; record/ keeps what a watch saw. Imports no textual or rich: the headless path, the recorder and
the replay share this package.
"""
