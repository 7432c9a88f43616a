"""The OpenAI-compatible request bodies: types are checked strictly and every refusal names its field.

Fields the engine cannot honour (n > 1, best_of, logprobs, penalties, ...) are refused with 400 when a
client sets them to anything but their neutral value; fields nobody here knows are ignored, as vLLM does.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
               405: "MethodNotAllowedError", 408: "RequestTimeoutError", 413: "RequestEntityTooLargeError",
               500: "InternalServerError", 503: "ServiceUnavailableError"}


class APIError(Exception):
    """An HTTP error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": ERROR_TYPES.get(self.status, "APIError"),
                          "param": self.param, "code": self.status}}


SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what torch.Generator.manual_seed accepts
ONE_PROMPT = "must be a string or one list of token ids (integers); send one request per prompt"


def first_surrogate(text: str) -> int | None:
    """Where a lone surrogate (JSON's "\\ud800" alone: not a character) sits in the text, if one does."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def unicode_text(text: str) -> str:
    """The text, or ValueError for a lone surrogate, which no tokenizer can take."""
    bad = first_surrogate(text)
    if bad is not None:
        raise ValueError(f"must be Unicode text: a lone surrogate (U+{ord(text[bad]):04X}) at character {bad}")
    return text


# field -> its neutral value(s): anything else asks for something the engine does not do
UNSUPPORTED: dict[str, tuple] = {
    "n": (1,), "best_of": (1,), "logprobs": (False,), "top_logprobs": (0,), "echo": (False,), "suffix": (),
    "presence_penalty": (0,), "frequency_penalty": (0,), "repetition_penalty": (1,), "top_k": (0, -1),
    "min_tokens": (0,), "logit_bias": ({},), "tools": ([],),
}


def _same(value: Any, option: Any) -> bool:
    """1 and 1.0 are the same value here; True and 1 are not."""
    if isinstance(value, bool) or isinstance(option, bool):
        return value is option
    if isinstance(value, (int, float)) and isinstance(option, (int, float)):
        return value == option
    return type(value) is type(option) and value == option


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False


class SamplingBody(BaseModel):
    """What completions and chat share."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
    model: str | None = None
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stop: Any = ()  # the stop strings, as a tuple once validated
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, value: Any) -> tuple[str, ...]:
        if value is None or isinstance(value, str):
            return (unicode_text(value),) if value else ()
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            return tuple(unicode_text(s) for s in value if s)
        raise ValueError("must be a string or a list of strings")

    def check_supported(self) -> None:
        """400 for a field set to something the engine cannot do, or a stream option without a stream."""
        extra = self.model_extra or {}
        for name, neutral in UNSUPPORTED.items():
            value = extra.get(name)
            if value is not None and not any(_same(value, option) for option in neutral):
                raise APIError(400, f"{name}={value!r} is not supported by batchtop (one completion per "
                                    f"request, no logprobs, no penalties)", name)
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed when stream is true", "stream_options")

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionBody(SamplingBody):
    prompt: Any
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's and vLLM's default for completions

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> str | tuple[int, ...]:
        if isinstance(value, str):
            return unicode_text(value)
        if isinstance(value, list):  # its items are checked once its length is known to fit (token_ids)
            return tuple(value)
        raise ValueError(ONE_PROMPT)

    def token_ids(self, longest: int) -> tuple[int, ...]:
        """The prompt's ids; each is checked to be an integer only when there are at most `longest`, as
        a longer prompt is refused by its length alone (a 4 MiB body's two million ids are never scanned)."""
        ids = self.prompt
        if len(ids) <= longest and not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise APIError(400, f"prompt: {ONE_PROMPT}", "prompt")
        return ids


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    role: str
    content: Any = None

    @field_validator("role")
    @classmethod
    def _role(cls, value: str) -> str:
        return unicode_text(value)

    @field_validator("content", mode="before")
    @classmethod
    def _text(cls, value: Any) -> str:
        """A string, or OpenAI's list of content parts when every part is text."""
        if value is None or isinstance(value, str):
            return unicode_text(value or "")
        if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                           and isinstance(p.get("text"), str) for p in value):
            return unicode_text("".join(p["text"] for p in value))
        raise ValueError("must be a string or a list of text parts ({\"type\": \"text\", \"text\": ...})")


class ChatBody(SamplingBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def validation_error(errors: list[dict]) -> APIError:
    """pydantic's validation errors as one 400 naming the first bad field (prompt[3], temperature, ...)."""
    first = errors[0]
    loc = list(first.get("loc", ()))
    if not loc:
        return APIError(400, f"the body must be a JSON object: {first['msg']}")
    param = str(loc[0]) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:])
    message = first["msg"].removeprefix("Value error, ")
    return APIError(400, f"{param}: {message}", param)
