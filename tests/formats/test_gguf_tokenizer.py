"""A SentencePiece ("llama") GGUF tokenizer against transformers' conversion of the same file."""

from __future__ import annotations

import pytest

from tessera.formats.tokenizer import load_tokenizer
from tests.formats.spm_helpers import SPM_TEXTS, write_spm_gguf

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")



@pytest.fixture(scope="module")
def spm_gguf(tmp_path_factory):
    return write_spm_gguf(tmp_path_factory.mktemp("spm") / "tiny-spm.gguf")


def test_sentencepiece_gguf_matches_transformers(spm_gguf):
    ours = load_tokenizer(str(spm_gguf))
    oracle = transformers.AutoTokenizer.from_pretrained(str(spm_gguf.parent),
                                                        gguf_file=spm_gguf.name)
    assert ours.context_length == 256 and ours.eos_token_ids == [2]
    for text in SPM_TEXTS:
        ids = ours.encode(text)
        assert ids == oracle.encode(text), text
        assert ids[:1] == [1]  # BOS, as llama.cpp adds for SentencePiece models
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == \
                oracle.decode(ids, skip_special_tokens=skip), text
    assert ours.decode(ours.encode("unseen: 東京 🎉 é")) == "unseen: 東京 🎉 é"  # byte fallback
    assert ours.apply_chat_template([{"role": "user", "content": "hi"}]) == "[user] hi\n"
