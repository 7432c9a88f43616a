"""batchtop attach: the console over a live vLLM, SGLang or batchtop server, read from its /metrics.

Imports no textual or rich: the headless path, the recorder and the replay share this package.
"""
