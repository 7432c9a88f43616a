"""A GGUF file's tokenizer, rebuilt from its metadata with the `tokenizers` package.

Two vocabulary kinds, as llama.cpp names them in tokenizer.ggml.model:
- "gpt2": byte-level BPE (tokens, merges) split first by the pre-tokenizer regex tokenizer.ggml.pre
  names (GPT-2's, Llama 3's, Qwen2's);
- "llama": SentencePiece-style BPE (tokens, scores; byte tokens <0x00>..<0xFF> as fallback): a pair
  merges into the piece with the highest score first, which BPE merges ranked by that score do.
Control tokens become special tokens (dropped from decoded text); BOS is added when
tokenizer.ggml.add_bos_token says so. Generation ends at every end-of-generation token: the EOS,
EOT and EOM ids the metadata gives and every token whose text marks an end of turn, as llama.cpp
decides them.
"""

from __future__ import annotations

import math

from batchtop.core_engine.errors import BadInput
from batchtop.core_engine.model.gguf_header import GGUFHeader
from batchtop.core_engine.model.tokenizer import Tokenizer

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
END_OF_TURN_TEXTS = frozenset({"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                               "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>"})
END_IDS = ("eos_token_id", "eot_token_id", "eom_token_id")
_LETTERS_FIRST = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
_REST = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# tokenizer.ggml.pre -> the regex text is split by before byte-level BPE (None: GPT-2's own)
PRE_TOKENIZERS: dict[str, str | None] = {
    "default": None, "gpt-2": None, "gpt2": None, "smollm": None, "olmo": None, "mpt": None, "starcoder": None,
    "llama-bpe": _LETTERS_FIRST + r"\p{N}{1,3}" + _REST, "llama3": _LETTERS_FIRST + r"\p{N}{1,3}" + _REST,
    "smaug-bpe": _LETTERS_FIRST + r"\p{N}{1,3}" + _REST, "dbrx": _LETTERS_FIRST + r"\p{N}{1,3}" + _REST,
    "qwen2": _LETTERS_FIRST + r"\p{N}" + _REST, "deepseek-r1-qwen": _LETTERS_FIRST + r"\p{N}" + _REST,
}


def tokens_of(h: GGUFHeader) -> tuple[list[str], list[int]]:
    """The vocabulary, each token a distinct non-empty string (the tokenizer maps text to one id)."""
    tokens = h.metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise BadInput(f"{h.path}: tokenizer.ggml.tokens is missing or not a list of strings")
    if len(set(tokens)) != len(tokens) or "" in tokens:
        first: dict[str, int] = {}
        for i, token in enumerate(tokens):
            if not token:
                raise BadInput(f"{h.path}: tokenizer.ggml.tokens[{i}] is an empty string")
            if first.setdefault(token, i) != i:
                raise BadInput(f"{h.path}: tokenizer.ggml.tokens[{i}] {token!r} repeats tokenizer.ggml.tokens"
                               f"[{first[token]}]")
    types = h.metadata.get("tokenizer.ggml.token_type", [NORMAL] * len(tokens))
    if not isinstance(types, list) or len(types) != len(tokens):
        raise BadInput(f"{h.path}: tokenizer.ggml.token_type must have one entry per token ({len(tokens)})")
    return tokens, types


def _special_id(h: GGUFHeader, key: str, vocab: int) -> int | None:
    value = h.metadata.get(f"tokenizer.ggml.{key}")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab:
        raise BadInput(f"{h.path}: tokenizer.ggml.{key} {value!r} is not a token id in [0, {vocab})")
    return value


def end_of_generation_ids(h: GGUFHeader, tokens: list[str]) -> tuple[int, ...]:
    ids = {i for key in END_IDS if (i := _special_id(h, key, len(tokens))) is not None}
    ids |= {i for i, text in enumerate(tokens) if text in END_OF_TURN_TEXTS}
    return tuple(sorted(ids))


def _byte_level(h: GGUFHeader, tokens: list[str]):
    from tokenizers import Regex, Tokenizer as RustTokenizer, decoders, models, pre_tokenizers
    merges = h.metadata.get("tokenizer.ggml.merges")
    if not isinstance(merges, list) or not all(isinstance(m, str) and " " in m for m in merges):
        raise BadInput(f"{h.path}: tokenizer.ggml.merges is missing or not a list of 'left right' strings")
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    for i, (left, right) in enumerate(pairs):
        for piece in (left, right, left + right):
            if piece not in vocab:
                raise BadInput(f"{h.path}: tokenizer.ggml.merges[{i}] {merges[i]!r} needs {piece!r}, which is not "
                               "in tokenizer.ggml.tokens")
    pre = h.metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise BadInput(f"{h.path}: tokenizer.ggml.pre {pre!r} is not a pre-tokenizer batchtop knows "
                       f"(known: {', '.join(PRE_TOKENIZERS)})")
    pattern = PRE_TOKENIZERS[pre]
    model = _built(h, "tokenizer.ggml.merges", lambda: models.BPE(
        vocab, pairs, ignore_merges=pattern is not None and r"\p{N}{1,3}" in pattern))
    tok = RustTokenizer(model)
    if pattern is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok, False


def _built(h: GGUFHeader, key: str, build):
    """The `tokenizers` model `build` makes; its bare Exception (what the checks above should have
    caught) named by the file and the key instead of a traceback."""
    try:
        return build()
    except Exception as exc:  # noqa: BLE001 (the Rust side raises a bare Exception)
        raise BadInput(f"{h.path}: {key}: the tokenizer cannot be built from it ({exc})") from None


def spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """Merges that rebuild SentencePiece's encoding: every way to cut a piece into two pieces of the
    vocabulary, best piece (highest score) first."""
    ids = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED, UNUSED)}
    found = []
    for piece, i in ids.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                found.append((-scores[i], i, ids[left], left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def _sentencepiece(h: GGUFHeader, tokens: list[str], types: list[int]):
    from tokenizers import Tokenizer as RustTokenizer, decoders, models, pre_tokenizers
    scores = h.metadata.get("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise BadInput(f"{h.path}: tokenizer.ggml.scores must have one score per token ({len(tokens)})")
    bad = next((i for i, s in enumerate(scores) if not isinstance(s, (int, float)) or isinstance(s, bool)
                or not math.isfinite(s)), None)
    if bad is not None:  # a NaN would order the merges arbitrarily
        raise BadInput(f"{h.path}: tokenizer.ggml.scores[{bad}] must be a finite number, got {scores[bad]!r}")
    unk = _special_id(h, "unknown_token_id", len(tokens))
    tok = RustTokenizer(_built(h, "tokenizer.ggml.scores", lambda: models.BPE(
        {t: i for i, t in enumerate(tokens)}, spm_merges(tokens, scores, types),
        unk_token=tokens[unk] if unk is not None else None, fuse_unk=True, byte_fallback=True)))
    prefix = h.metadata.get("tokenizer.ggml.add_space_prefix", True) is not False
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first" if prefix else "never",
                                                 split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok, True


def gguf_tokenizer(h: GGUFHeader) -> Tokenizer:
    """The file's tokenizer, with its chat template and end-of-generation ids."""
    from tokenizers import AddedToken, processors
    kind = h.metadata.get("tokenizer.ggml.model")
    tokens, types = tokens_of(h)
    if kind == "gpt2":
        tok, bos_default = _byte_level(h, tokens)
    elif kind == "llama":
        tok, bos_default = _sentencepiece(h, tokens, types)
    else:
        raise BadInput(f"{h.path}: tokenizer.ggml.model {kind!r} is not supported (supported: gpt2, llama)")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind_ in zip(tokens, types) if kind_ == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, kind_ in zip(tokens, types) if kind_ == USER_DEFINED])
    bos = _special_id(h, "bos_token_id", len(tokens))
    eos = _special_id(h, "eos_token_id", len(tokens))
    add_bos = h.metadata.get("tokenizer.ggml.add_bos_token", bos_default) is True and bos is not None
    if add_bos:
        tok.post_processor = _built(h, "tokenizer.ggml.bos_token_id", lambda: processors.TemplateProcessing(
            single=f"{tokens[bos]}:0 $A:0", pair=f"{tokens[bos]}:0 $A:0 {tokens[bos]}:1 $B:1",
            special_tokens=[(tokens[bos], bos)]))
    template = h.metadata.get("tokenizer.chat_template")
    return Tokenizer(tok, eos_token_ids=end_of_generation_ids(h, tokens),
                     chat_template=template if isinstance(template, str) and template else None,
                     bos_token=tokens[bos] if bos is not None else None,
                     eos_token=tokens[eos] if eos is not None else None,
                     chat_template_origin=f"{h.path}: tokenizer.chat_template")
