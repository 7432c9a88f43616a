"""Text and chat prompts of workload files into token ids, with every failure a named error.

JSON can spell a lone surrogate ("\\ud800" alone), and a chat template can write one: it is not a
character, and the tokenizer refuses it with a TypeError. Both are caught here and named: the field
that holds it, or the template that wrote it (serve answers a template's with a 500 the same way).
"""

from __future__ import annotations

from collections.abc import Callable

from batchtop.core_engine.errors import BadInput, WorkloadError
from batchtop.core_engine.model.tokenizer import Tokenizer
from batchtop.core_engine.text_files import first_surrogate

Error = Callable[[str], WorkloadError]


def surrogate_words(text: str, at: int) -> str:
    return f"a lone surrogate (U+{ord(text[at]):04X}, not a character) at character {at}"


def check_text(text: str, field: str, error: Error) -> None:
    """error naming `field` when the text holds a lone surrogate."""
    bad = first_surrogate(text)
    if bad is not None:
        raise error(f"{field} must be Unicode text: it holds {surrogate_words(text, bad)}")


def text_tokens(tokenizer: Tokenizer, text: str, field: str, error: Error,
                add_special_tokens: bool = True) -> list[int]:
    """The text's token ids; error naming `field` when it holds a lone surrogate."""
    check_text(text, field, error)
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def chat_tokens(tokenizer: Tokenizer, messages: list[dict], field: str, error: Error) -> list[int]:
    """The conversation rendered by the model's chat template (the assistant turn opened), tokenized;
    error naming the message or the template when either is not text."""
    for i, message in enumerate(messages):
        check_text(message["content"], f"{field}[{i}].content", error)
    try:
        text = tokenizer.apply_chat_template(messages)
    except BadInput as exc:
        raise error(f"{field}: {exc}") from None
    bad = first_surrogate(text)
    if bad is not None:
        raise error(f"{field}: the model's chat template ({tokenizer.chat_template_origin}) wrote "
                    f"{surrogate_words(text, bad)} into the prompt")
    return tokenizer.encode(text, add_special_tokens=False)  # the template wrote its own special tokens
