"""Text in and out of the server, through one small interface a tokenizer implements.

The random presets have no tokenizer: they take token-id prompts and answer with token ids. A model
with a tokenizer (issue "Bring your own model") plugs in as a TextCodec and text prompts, chat and stop
strings work. OutputText turns one request's tokens into the text its client sees, step by step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

TOKENIZER_NEEDED = ("needs a tokenizer, and the random presets have none: give token ids "
                    "(a list of integers) as the prompt, or serve a model directory that has one")


class IncrementalDecoder(Protocol):
    def feed(self, token_ids: Sequence[int]) -> str:
        """The text these tokens complete; bytes of a character not yet complete are held back."""


class TextCodec(Protocol):
    eos_token_ids: tuple[int, ...]
    chat_template: str | None  # Jinja source; None: no chat
    chat_template_origin: str  # the file it came from

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """add_special_tokens=False for a chat template's prompt, which has its BOS in the text already."""

    def template_variables(self) -> dict[str, str]:
        """What the template reads besides messages and add_generation_prompt (bos_token, ...)."""

    def max_text_bytes(self, tokens: int) -> int | None:
        """A text over this many UTF-8 bytes is more than `tokens` tokens; None when unknown."""

    def decoder(self) -> IncrementalDecoder: ...


class OutputText:
    """One request's output text as it streams, cut at the first stop string (which is never sent).

    Text that could still become a stop string is held back until it cannot, so a client never sees
    the beginning of a stop string that later completes."""

    def __init__(self, codec: TextCodec | None, stops: tuple[str, ...] = ()) -> None:
        self._decoder = codec.decoder() if codec is not None else None
        self._stops = stops
        self._hold = max((len(s) for s in stops), default=1) - 1
        self._pending = ""
        self.stopped = False

    def feed(self, token_ids: Sequence[int]) -> str:
        """The text to send for these tokens; sets `stopped` when a stop string appeared."""
        if self._decoder is None or self.stopped:
            return ""
        self._pending += self._decoder.feed(token_ids)
        cut = min((i for i in (self._pending.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self._pending = self._pending[:cut], ""
            return out
        keep = min(self._hold, len(self._pending))
        out = self._pending[:len(self._pending) - keep]
        self._pending = self._pending[len(out):]
        return out

    def flush(self) -> str:
        """What was held back, once the request has ended without reaching a stop string."""
        out, self._pending = self._pending, ""
        return out
