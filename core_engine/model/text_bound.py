"""How many bytes of text can become at most N tokens: a bound found once from tokenizer.json, so a
server refuses a prompt that can never fit before it spends seconds tokenizing it.

Every token of a BPE vocabulary stands for at most as many bytes of (normalized) text as its own
string has, and a normalizer shrinks text by a bounded factor. The bound holds only when no byte of
text can vanish: an unknown character must become a token of its own (byte fallback, a byte-level
alphabet, an unfused unk token), and no normalizer or pre-tokenizer may drop text (Strip,
StripAccents, a regex Replace, a Whitespace split ...). Anything else gets no bound (None).
"""

from __future__ import annotations

import json

import tokenizers
from tokenizers import pre_tokenizers

UNICODE_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase"}  # 3 bytes become 1 at most (Ａ -> A)
UNICODE_SHRINK = 4
KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "Punctuation", "UnicodeScripts", "Split"}
MAX_CHAR_BYTES = 4


def _shrink(normalizer: dict | None) -> float | None:
    """How many times shorter (in UTF-8 bytes) the normalizer can make a text; None: unbounded."""
    if normalizer is None:
        return 1.0
    kind = normalizer.get("type")
    if kind == "Sequence":
        factor = 1.0
        for part in normalizer.get("normalizers", ()):
            step = _shrink(part)
            if step is None:
                return None
            factor *= step
        return factor
    if kind in UNICODE_NORMALIZERS:
        return UNICODE_SHRINK
    if kind in ("Prepend", "ByteLevel"):
        return 1.0
    if kind == "Replace":
        pattern, content = normalizer.get("pattern", {}).get("String"), normalizer.get("content", "")
        if not pattern or not content:  # a regex could match anything; empty content deletes
            return None
        return max(1.0, len(pattern.encode()) / len(content.encode()))
    return None


def _keeps_text(pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind == "Sequence":
        return all(_keeps_text(p) for p in pre_tokenizer.get("pretokenizers", ()))
    if kind == "Split" and pre_tokenizer.get("behavior") == "Removed":
        return False
    return kind in KEEPING_PRE_TOKENIZERS


def _has_byte_level(pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return False
    if pre_tokenizer.get("type") == "Sequence":
        return any(_has_byte_level(p) for p in pre_tokenizer.get("pretokenizers", ()))
    return pre_tokenizer.get("type") == "ByteLevel"


def bytes_per_token(tokenizer: tokenizers.Tokenizer) -> float | None:
    """At most this many bytes of text per token, or None when the tokenizer can drop text."""
    spec = json.loads(tokenizer.to_str())
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer")
    if model.get("type") != "BPE" or not _keeps_text(pre):
        return None
    shrink = _shrink(spec.get("normalizer"))
    if shrink is None:
        return None
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    longest = max((len(token.encode("utf-8", "surrogatepass")) for token in vocab), default=0)
    if model.get("byte_fallback"):
        pass  # an unknown character becomes its bytes, one token each
    elif model.get("unk_token") is not None and not model.get("fuse_unk"):
        longest = max(longest, MAX_CHAR_BYTES)  # an unknown character becomes one unk token
    elif not (_has_byte_level(pre) and set(pre_tokenizers.ByteLevel.alphabet()) <= vocab.keys()):
        return None  # an unknown character would vanish
    return longest * shrink if longest else None
