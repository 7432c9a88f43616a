"""The network: a Llama-family decoder and its packed linear layers."""
