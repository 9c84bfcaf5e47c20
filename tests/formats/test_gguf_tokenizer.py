"""GGUF tokenizers (SentencePiece "llama", byte-level "gpt2" with llama.cpp's pre-tokenizer
names) against transformers' conversion of the same file."""

from __future__ import annotations

import json

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


BYTE_TEXTS = ["Hello world", "It's 2024: 12345 apples!!", "  spaces\n\n\tand\r\nlines  ",
              "日本語 🎉 e\u0301", "don't WON'T", "<|im_start|>x<|im_end|>", ""]


@pytest.mark.parametrize("pre", ["qwen2", "llama-bpe", "gpt2"])
def test_byte_level_pre_tokenizers_match_transformers(tmp_path, pre):
    import tokenizers

    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400, show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(BYTE_TEXTS * 10 + ["the quick brown fox 0123456789"] * 10, trainer)
    spec = json.loads(bpe.to_str())["model"]
    tokens = ["<|im_start|>", "<|im_end|>"] + \
        [t for t, _ in sorted(spec["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["merges"]]
    path = tmp_path / f"tiny-{pre}.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2" if pre == "qwen2" else "llama")
    w.add_context_length(128)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3, 3] + [1] * (len(tokens) - 2))
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours = load_tokenizer(str(path))
    oracle = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in BYTE_TEXTS:
        assert ours.encode(text) == oracle.encode(text), text
        assert ours.decode(ours.encode(text), skip_special_tokens=False) == text


def test_header_reader_matches_the_gguf_library(spm_gguf):
    from tessera.formats.gguf_tokenizer import _gguf_fields

    ours = _gguf_fields(str(spm_gguf))
    reader = gguf.GGUFReader(str(spm_gguf), "r")
    assert {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
            "tokenizer.chat_template", "llama.context_length"} <= ours.keys()
    for key, value in ours.items():
        assert reader.fields[key].contents() == value, key
