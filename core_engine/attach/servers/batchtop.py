"""batchtop serve: vLLM's names, plus its own `batchtop:` gauges for the knobs vLLM does not export
(the slot ceiling, the token budget, the batching mode)."""

import dataclasses

from batchtop.core_engine.attach.servers.family import Knobs, ServerFamily
from batchtop.core_engine.attach.servers.vllm import NAMES as VLLM_NAMES, VLLM
from batchtop.core_engine.config import MAX_NUM_SEQS_LIMIT

BATCHTOP = "batchtop"
MAX_NUM_SEQS = "batchtop:max_num_seqs"
NAMES = dataclasses.replace(VLLM_NAMES, ceiling=MAX_NUM_SEQS, token_budget="batchtop:max_num_batched_tokens",
                            mode="batchtop:mode")

FAMILY = ServerFamily(
    name=BATCHTOP, label="batchtop serve", documented="core_engine/serve (its /metrics)", names=NAMES,
    prefix="batchtop:", extends=VLLM,
    gaps={"waiting_reasons": "batchtop serve gives no waiting reasons on /metrics"},
    knobs=Knobs("--max-num-seqs", "--max-num-batched-tokens", "--num-kv-blocks"),
    ceiling_limit=MAX_NUM_SEQS_LIMIT)
