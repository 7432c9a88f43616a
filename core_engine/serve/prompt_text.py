"""Text prompts and chats into token ids, never on the event loop.

A text is measured first: one longer than the longest prompt this server takes could ever hold (the
tokenizer's max_text_bytes) is refused at once, untokenized. A text that may fit is tokenized on a
thread of its own. A chat is rendered by the model's template in a process of its own
(TemplateProcess, driven from one more thread), and its prompt then measured and tokenized the same way.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from batchtop.core_engine.config import EngineConfig
from batchtop.core_engine.model.chat_template import PromptTooLong, TemplateBroken, TemplateRefused
from batchtop.core_engine.model.template_process import RENDER_SECONDS, TemplateProcess
from batchtop.core_engine.serve.protocol import APIError, ChatMessage, first_surrogate
from batchtop.core_engine.serve.text import TextCodec

MAX_TEMPLATE_BYTES = 16 << 20  # a template's prompt when the tokenizer gives no tighter bound
TOKENIZE_THREADS = 2


def start_chat(codec: TextCodec | None, seconds: float = RENDER_SECONDS) -> TemplateProcess | None:
    """The codec's chat template in its own process, compiled; BadInput when it does not parse."""
    if codec is None or codec.chat_template is None:
        return None
    process = TemplateProcess(codec.chat_template, codec.template_variables(), codec.chat_template_origin,
                              seconds=seconds)
    process.start()
    return process


class PromptText:
    def __init__(self, codec: TextCodec, config: EngineConfig, chat: TemplateProcess | None) -> None:
        self.codec = codec
        self.chat_process = chat
        kv_tokens = config.num_kv_blocks * config.block_size + 1  # the last sampled token needs no KV slot
        self.longest = min(config.max_model_len, kv_tokens) - 1  # and one output token at least
        self._why = f"max_model_len {config.max_model_len}, a KV pool of {kv_tokens - 1} tokens"
        self.max_bytes = codec.max_text_bytes(self.longest)
        self._tokenizer = ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="batchtop-tokenize")
        self._renderer = ThreadPoolExecutor(1, thread_name_prefix="batchtop-template")

    async def tokens(self, text: str, param: str, add_special_tokens: bool = True) -> tuple[int, ...]:
        size = len(text.encode("utf-8", "surrogatepass"))
        if self.max_bytes is not None and size > self.max_bytes:
            raise APIError(400, f"{param}: the text is {size} bytes; the longest prompt this server takes is "
                                f"{self.longest} tokens ({self._why}), at most {self.max_bytes} bytes with this "
                                f"tokenizer", param)
        loop = asyncio.get_running_loop()
        try:
            return tuple(await loop.run_in_executor(self._tokenizer, self.codec.encode, text, add_special_tokens))
        except Exception as exc:  # the tokenizer's own failure, not the request's
            raise APIError(500, f"the tokenizer failed on this {param}: {type(exc).__name__}: {exc}") from None

    async def chat(self, messages: list[ChatMessage]) -> tuple[int, ...]:
        if self.chat_process is None:
            raise APIError(400, "/v1/chat/completions applies the model's chat template, and this model's "
                                "tokenizer has none", "messages")
        limit = MAX_TEMPLATE_BYTES if self.max_bytes is None else min(self.max_bytes, MAX_TEMPLATE_BYTES)
        loop = asyncio.get_running_loop()
        try:
            text = await loop.run_in_executor(self._renderer, self._render, messages, limit)
        except PromptTooLong as exc:
            raise APIError(400, f"messages: {exc}; the longest prompt this server takes is {self.longest} tokens "
                                f"({self._why})", "messages") from None
        except TemplateRefused as exc:
            raise APIError(400, f"messages: {exc}", "messages") from None
        except TemplateBroken as exc:
            raise APIError(500, f"the model's chat template ({self.chat_process.origin}) failed: {exc}") from None
        bad = first_surrogate(text)
        if bad is not None:
            raise APIError(500, f"the model's chat template ({self.chat_process.origin}) wrote a lone surrogate "
                                f"(U+{ord(text[bad]):04X}, not text) at character {bad}")
        return await self.tokens(text, "messages", add_special_tokens=False)  # the template wrote its own

    def _render(self, messages: list[ChatMessage], limit: int) -> str:
        return self.chat_process.render([{"role": m.role, "content": m.content} for m in messages], limit)

    def close(self) -> None:
        self._tokenizer.shutdown(wait=False, cancel_futures=True)
        self._renderer.shutdown(wait=False, cancel_futures=True)
