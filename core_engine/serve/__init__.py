"""`batchtop serve`: an OpenAI-compatible HTTP server on the engine, with vLLM-named /metrics.

Nothing here imports textual or rich: the headless server runs without a screen.
"""
