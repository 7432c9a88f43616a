"""From a validated request body to the engine's Request, refusing what the engine could never serve.

Everything the engine would reject is refused here with 400 and the engine never sees it: a prompt
plus max_tokens over max_model_len or over the KV pool (the message gives both numbers), a token id
outside the vocabulary, text without a tokenizer. Text becomes tokens off the event loop (prompt_text).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batchtop.core_engine.config import EngineConfig
from batchtop.core_engine.sched.request import Request, SamplingParams
from batchtop.core_engine.engine.validation import validate_request
from batchtop.core_engine.errors import InvalidRequest, UnservableRequest
from batchtop.core_engine.model.template_process import TemplateProcess
from batchtop.core_engine.serve.prompt_text import PromptText
from batchtop.core_engine.serve.protocol import APIError, ChatBody, CompletionBody, SamplingBody
from batchtop.core_engine.serve.text import TOKENIZER_NEEDED, TextCodec


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str  # what /v1/models lists and requests must name (when they name one)
    config: EngineConfig
    codec: TextCodec | None = None
    # sampling a request leaves unset takes these (the model's generation_config.json, as vLLM does)
    defaults: dict[str, float] = field(default_factory=dict)
    chat: TemplateProcess | None = None  # the codec's chat template, in its own process (start_chat)

    def check_name(self, requested: str | None) -> None:
        if requested is not None and requested != self.name:
            raise APIError(404, f"The model `{requested}` does not exist; this server serves `{self.name}`.", "model")

    def longest_output(self, prompt_len: int) -> int:
        """max_tokens when a request leaves it out: all that max_model_len and the KV pool allow."""
        c = self.config
        kv_tokens = c.num_kv_blocks * c.block_size + 1  # the last sampled token needs no KV slot
        return max(1, min(c.max_model_len, kv_tokens) - prompt_len)


async def completion_prompt(body: CompletionBody, model: ServedModel, text: PromptText | None) -> tuple[int, ...]:
    if isinstance(body.prompt, str):
        if text is None:
            raise APIError(400, f"a text prompt {TOKENIZER_NEEDED}", "prompt")
        return await text.tokens(body.prompt, "prompt")
    return body.token_ids(model.config.max_model_len)


async def chat_prompt(body: ChatBody, text: PromptText | None) -> tuple[int, ...]:
    if text is None:
        raise APIError(400, f"/v1/chat/completions applies the model's chat template, so it {TOKENIZER_NEEDED} "
                            "with a chat template", "messages")
    return await text.chat(body.messages)


def engine_request(request_id: str, prompt: tuple[int, ...], body: SamplingBody, max_tokens: int | None,
                   model: ServedModel) -> Request:
    if not prompt:
        raise APIError(400, "prompt: must not be empty", "prompt")
    if body.stop and model.codec is None:
        raise APIError(400, f"a stop string {TOKENIZER_NEEDED}", "stop")
    # the engine stops at the model's EOS ids (a model directory's generation_config.json; none for presets)
    unset = {k: v for k, v in model.defaults.items() if k not in body.model_fields_set}
    sampling = SamplingParams(temperature=unset.get("temperature", body.temperature),
                              top_p=unset.get("top_p", body.top_p), seed=body.seed, ignore_eos=body.ignore_eos)
    max_tokens = model.longest_output(len(prompt)) if max_tokens is None else max_tokens
    request = Request(request_id, prompt, max_tokens, 0.0, sampling)
    try:
        validate_request(request, model.config, set())
    except InvalidRequest as exc:
        message = str(exc).removeprefix(f"request {request_id!r}: ")
        raise APIError(400, message, "max_tokens" if isinstance(exc, UnservableRequest) else "prompt") from None
    return request
