"""OpenAI's response and stream-chunk objects for completions and chat, and their SSE framing.

Every choice also carries `token_ids` (vLLM's extension): with the random presets there is no text,
and the ids are what the model produced.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

DONE = "data: [DONE]\n\n"


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


@dataclass(frozen=True, slots=True)
class Shape:
    """Where completions and chat differ: object names, and how a choice carries its text."""

    object: str
    chunk_object: str
    chat: bool
    id_prefix: str  # of the request ids, which the panels show

    def response(self, rid: str, created: int, model: str, text: str, token_ids: list[int], finish_reason: str,
                 prompt_tokens: int) -> dict:
        choice: dict = {"index": 0, "finish_reason": finish_reason, "logprobs": None, "token_ids": token_ids}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {"id": rid, "object": self.object, "created": created, "model": model, "choices": [choice],
                "usage": usage(prompt_tokens, len(token_ids))}

    def chunk(self, rid: str, created: int, model: str, text: str, token_ids: tuple[int, ...],
              finish_reason: str | None, with_usage: bool, first: bool = False) -> dict:
        """One engine step's tokens for one request (`usage: null` on every chunk when usage was asked for)."""
        choice: dict = {"index": 0, "finish_reason": finish_reason, "logprobs": None, "token_ids": list(token_ids)}
        if self.chat:
            choice["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
        else:
            choice["text"] = text
        out = {"id": rid, "object": self.chunk_object, "created": created, "model": model, "choices": [choice]}
        if with_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, rid: str, created: int, model: str, prompt_tokens: int, completion_tokens: int) -> dict:
        """The extra last chunk of stream_options.include_usage: no choices, the whole request's usage."""
        return {"id": rid, "object": self.chunk_object, "created": created, "model": model, "choices": [],
                "usage": usage(prompt_tokens, completion_tokens)}


COMPLETION = Shape("text_completion", "text_completion", chat=False, id_prefix="cmpl")
CHAT = Shape("chat.completion", "chat.completion.chunk", chat=True, id_prefix="chat")
