"""A checkpoint's tokenizer: tokenizer.json through the `tokenizers` package (no transformers at run time).

The API other parts rely on (the workload reader, the dashboard, the server):

    tok = Tokenizer.from_dir(model_dir)        # None when the directory has no tokenizer.json
    ids = tok.encode("text")                   # list[int], with the tokenizer's BOS when it adds one
    text = tok.decode(ids)                     # whole-sequence decode (special tokens dropped)
    stream = tok.stream(prompt_ids)            # incremental: stream.push(token_id) -> new text ("" while
                                               # a multi-byte character is still incomplete);
                                               # stream.flush() at the end -> what is still held
    prompt = tok.apply_chat_template(messages) # when the checkpoint has a chat template
    tok.eos_token_ids                          # generation_config.json's EOS ids (else config.json's)
    tok.max_text_bytes(n)                      # the most bytes of text n tokens can hold (None: unknown)

It is also the server's TextCodec (core_engine/serve/text.py): chat_template, template_variables(),
max_text_bytes(n) and decoder().feed(token_ids). The server renders the template in a process of its
own (model/template_process.py); apply_chat_template renders it here, under the same sandbox.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import tokenizers
from jinja2 import Template, TemplateSyntaxError
from tokenizers.decoders import DecodeStream

from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.model.chat_template import TemplateBroken, TemplateRefused, compile_template, render
from batchtop.core_engine.model.hf_config import eos_token_ids, read_json
from batchtop.core_engine.model.text_bound import bytes_per_token
from batchtop.core_engine.text_files import NotText, read_text_file

MAX_TEMPLATE_BYTES = 16 << 20  # a real chat template is a few KiB

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # where newer checkpoints keep the template
STREAM_CONTEXT = 8  # prompt tokens the stream decodes after, so the first output token's spacing is right
MAX_PROMPT_BYTES = 16 << 20  # what apply_chat_template may render


def _token_text(value: object) -> str | None:
    """tokenizer_config.json writes special tokens as "<s>" or as {"content": "<s>", ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class TextStream:
    """One sequence's incremental detokenizer: each push decodes only the tokens since the last text."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, prompt_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(ids=list(prompt_ids[-STREAM_CONTEXT:]), skip_special_tokens=True)
        self._held: list[int] = []  # pushed tokens whose text is not out yet (part of a character)

    def push(self, token_id: int) -> str:
        text = self._stream.step(self._tokenizer, token_id)
        if text is None:
            self._held.append(token_id)
            return ""
        self._held.clear()
        return text

    def feed(self, token_ids: Sequence[int]) -> str:
        return "".join(self.push(t) for t in token_ids)

    def flush(self) -> str:
        """At the end of the sequence: what held tokens decode to on their own (U+FFFD for a cut
        character), as a whole-sequence decode would end."""
        held, self._held = self._held, []
        return self._tokenizer.decode(held, skip_special_tokens=True) if held else ""


class Tokenizer:
    def __init__(self, tokenizer: tokenizers.Tokenizer, *, eos_token_ids: tuple[int, ...] = (),
                 chat_template: str | None = None, bos_token: str | None = None,
                 eos_token: str | None = None, chat_template_origin: str = TOKENIZER_CONFIG) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.chat_template = chat_template
        self.chat_template_origin = chat_template_origin  # the file it came from, for errors
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template: Template | None = None  # compiled on first use
        self._bytes_per_token: float | None | bool = False  # found on first use

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Tokenizer | None:
        d = Path(model_dir)
        path = d / TOKENIZER_FILE
        if not path.is_file():
            return None
        try:
            tok = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises a bare Exception for a malformed file
            raise BadInput(f"{path}: not a readable tokenizer ({exc})") from None
        config_path = d / TOKENIZER_CONFIG
        config = read_json(config_path) if config_path.is_file() else {}
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        origin = str(config_path)
        if (d / CHAT_TEMPLATE_FILE).is_file():
            origin = str(d / CHAT_TEMPLATE_FILE)
            try:
                template = read_text_file(d / CHAT_TEMPLATE_FILE, MAX_TEMPLATE_BYTES, "a chat template")
            except NotText as exc:
                raise BadInput(f"{d / CHAT_TEMPLATE_FILE}: {exc.message}") from None
        model_config = d / "config.json"
        eos = eos_token_ids(d, read_json(model_config) if model_config.is_file() else {})
        eos_text = _token_text(config.get("eos_token"))
        if not eos and eos_text is not None and tok.token_to_id(eos_text) is not None:
            eos = (tok.token_to_id(eos_text),)
        return cls(tok, eos_token_ids=eos, chat_template=template if isinstance(template, str) else None,
                   bos_token=_token_text(config.get("bos_token")), eos_token=eos_text, chat_template_origin=origin)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def stream(self, prompt_ids: Sequence[int] = ()) -> TextStream:
        return TextStream(self.tokenizer, prompt_ids)

    def decoder(self) -> TextStream:
        return self.stream()

    def max_text_bytes(self, tokens: int) -> int | None:
        """A text longer than this many UTF-8 bytes tokenizes to more than `tokens` tokens (None: no
        such bound for this tokenizer; see text_bound)."""
        if self._bytes_per_token is False:
            self._bytes_per_token = bytes_per_token(self.tokenizer)
        return None if self._bytes_per_token is None else int(tokens * self._bytes_per_token)

    def template_variables(self) -> dict[str, str]:
        """What a chat template reads besides the messages and add_generation_prompt."""
        return {"bos_token": self.bos_token or "", "eos_token": self.eos_token or ""}

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """The chat template's prompt, tokenized (its special tokens are in the text already)."""
        return self.encode(self.apply_chat_template(messages), add_special_tokens=False)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text for a chat, rendered by the checkpoint's own Jinja template; encode it with
        add_special_tokens=False (templates write their BOS themselves)."""
        if self.chat_template is None:
            raise BadInput(f"this model has no chat_template (none in {self.chat_template_origin})")
        try:
            if self._template is None:
                self._template = compile_template(self.chat_template)
            return render(self._template, {**self.template_variables(), "messages": messages,
                                           "add_generation_prompt": add_generation_prompt}, MAX_PROMPT_BYTES)
        except TemplateSyntaxError as exc:
            raise BadInput(f"{self.chat_template_origin}: the chat template does not parse: line {exc.lineno}: "
                           f"{exc.message}") from None
        except (TemplateRefused, TemplateBroken) as exc:
            raise BadInput(str(exc)) from None
