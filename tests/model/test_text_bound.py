"""max_text_bytes: a text over it can never be that few tokens, whatever the text (checked against the
real tokenizers on texts built to shrink: fullwidth letters, Hangul jamo, combining marks, spaces), and
a tokenizer that can drop text gets no bound at all."""

from __future__ import annotations

import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from batchtop.core_engine.model.export import train_byte_level_bpe
from batchtop.core_engine.model.text_bound import bytes_per_token
from batchtop.core_engine.model.tokenizer import Tokenizer
from tests.support.hf_checkpoints import SENTENCES

SHRINKING = st.lists(st.sampled_from(["Ａ", "ｂ", "\u1100", "\u1161", "\u11a8", "e\u0301", "\u212a", "  ", " ",
                                      "ab", "\t", "é", "你", "😀", "<s>", "\x00", "ﬁ"]), max_size=200).map("".join)


def metaspace_bpe() -> tokenizers.Tokenizer:
    """Llama 2's shape: NFKC + Metaspace + BPE with byte fallback and a fused unk."""
    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(),
                                           normalizers.Replace("  ", " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(SENTENCES, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>"] + [f"<0x{b:02X}>" for b in range(256)], show_progress=False))
    return tok


def bare_byte_level_nfkc() -> tokenizers.Tokenizer:
    """The 256 byte symbols and no merges, under NFKC: a bound with no slack beyond the normalizer's."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator([], trainers.BpeTrainer(vocab_size=256, show_progress=False,
                                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


BYTE_LEVEL = Tokenizer(train_byte_level_bpe(SENTENCES, 300))
METASPACE = Tokenizer(metaspace_bpe())
BARE = Tokenizer(bare_byte_level_nfkc())


@settings(max_examples=200, deadline=None)
@given(SHRINKING)
def test_no_text_over_the_bound_tokenizes_to_that_few_tokens(text):
    for tok in (BYTE_LEVEL, METASPACE, BARE):
        n = len(tok.encode(text, add_special_tokens=False))
        assert len(text.encode()) <= tok.max_text_bytes(n), (text, n)


def test_a_real_sentence_is_well_inside_the_bound():
    n = len(BYTE_LEVEL.encode(SENTENCES[0], add_special_tokens=False))
    assert len(SENTENCES[0].encode()) <= BYTE_LEVEL.max_text_bytes(n) <= 20 * len(SENTENCES[0].encode())


def test_a_tokenizer_that_can_drop_text_gets_no_bound():
    strip = metaspace_bpe()
    strip.normalizer = normalizers.Sequence([normalizers.Strip(), normalizers.NFC()])
    whitespace = train_byte_level_bpe(SENTENCES, 300)
    whitespace.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.ByteLevel()])
    unknowns_vanish = tokenizers.Tokenizer(models.BPE())  # no unk, no byte fallback, no byte alphabet
    unknowns_vanish.train_from_iterator(["abc"], trainers.BpeTrainer(vocab_size=10, show_progress=False))
    for tok in (strip, whitespace, unknowns_vanish):
        assert bytes_per_token(tok) is None
    assert unknowns_vanish.encode("zzzzzzzz").ids == []  # what the bound would have got wrong
