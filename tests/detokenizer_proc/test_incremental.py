"""Incremental detokenization: deltas add up to the full decode and never split a character."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.detokenizer_proc.incremental import REPLACEMENT, IncrementalDecoder

# Text mixing ASCII, CJK, emoji (multi-codepoint sequences too) and combining marks: byte-level
# BPE splits the multi-byte ones over several tokens. SmolLM2's vocabulary lacks a few bytes
# (some ASCII controls, the UTF-8 lead bytes of planes 4-16), so text using them cannot
# round-trip through any tokenizer of this model; the alphabet leaves them out.
CHARS = st.characters(max_codepoint=0x3FFFF, exclude_categories=["Cc", "Cs"])
PIECES = ["hello", " world", "日本語", "中文", "한국어", "🎉", "👩‍👩‍👧", "🇯🇵", "e\u0301",
          "a\u0300\u0323", "\n", "  ", "Ω", "ß", "\u200d", "<|im_end|>", "12"]
unicode_text = st.lists(st.one_of(st.sampled_from(PIECES), st.text(alphabet=CHARS, min_size=1, max_size=4)),
                        min_size=1, max_size=12).map("".join)
fast = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def run(tokenizer, ids, skip=False):
    dec = IncrementalDecoder(tokenizer, skip_special_tokens=skip)
    deltas = [dec.step(t) for t in ids]
    return deltas, dec.flush()


@fast
@given(text=unicode_text, skip=st.booleans())
def test_deltas_concatenate_to_the_full_decode(tokenizer, text, skip):
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas, tail = run(tokenizer, ids, skip)
    assert "".join(deltas) + tail == tokenizer.decode(ids, skip_special_tokens=skip)
    if not skip:
        assert "".join(deltas) + tail == text
    if REPLACEMENT not in text:
        for delta in deltas:
            assert REPLACEMENT not in delta  # never half a character


@fast
@given(ids=st.lists(st.integers(0, 49151), min_size=1, max_size=40), skip=st.booleans())
def test_any_token_sequence_decodes_the_same_incrementally(tokenizer, ids, skip):
    # Random ids end mid-character, start with continuation bytes, and so on.
    deltas, tail = run(tokenizer, ids, skip)
    assert "".join(deltas) + tail == tokenizer.decode(ids, skip_special_tokens=skip)


def test_emoji_split_over_tokens_is_held_back(tokenizer):
    ids = tokenizer.encode("ok 🎉", add_special_tokens=False)
    deltas, tail = run(tokenizer, ids)
    assert len(ids) > 3  # the emoji takes several byte tokens
    assert [d for d in deltas if d] == ["ok", " 🎉"]
    assert tail == ""


def test_a_sequence_ending_mid_character_shows_it_at_the_end(tokenizer):
    ids = tokenizer.encode("日", add_special_tokens=False)
    assert len(ids) > 1
    deltas, tail = run(tokenizer, ids[:-1])
    assert deltas == [""] * (len(ids) - 1)
    assert tail == tokenizer.decode(ids[:-1]) and REPLACEMENT in tail


@fast
@given(text=unicode_text, skip=st.booleans())
def test_sentencepiece_byte_fallback_deltas(spm_tokenizer, text, skip):
    # Byte-fallback tokens (<0xE6>...) carry one byte each; the "▁" of the first token is
    # stripped by the decoder, which windows starting mid-sequence must not disturb.
    ids = spm_tokenizer.encode(text, add_special_tokens=False)
    deltas, tail = run(spm_tokenizer, ids, skip)
    assert "".join(deltas) + tail == spm_tokenizer.decode(ids, skip_special_tokens=skip)
    if REPLACEMENT not in text:
        assert all(REPLACEMENT not in d for d in deltas)
