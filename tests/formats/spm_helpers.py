"""A tiny SentencePiece-style ("llama") GGUF tokenizer file, written with the gguf library."""

from __future__ import annotations

from pathlib import Path

CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, hello there",
          "tokenizers split words into pieces", "a cat sat on the mat with another cat"] * 20
SPM_TEXTS = ["hello world", "the cat sat", " leading space", "two  spaces", "unseen: 東京 🎉 é",
             "<s>hello</s> world", "quick\nbrown\tfox", ""]


def spm_vocab() -> tuple[list[str], list[float], list[int]]:
    """A small SentencePiece-style vocabulary (▁ for spaces, byte fallback tokens)."""
    import tokenizers

    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(prepend_scheme="first")
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, show_progress=False)
    bpe.train_from_iterator(CORPUS, trainer)
    learned = sorted(bpe.get_vocab().items(), key=lambda kv: kv[1])
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    tokens += [t for t, _ in learned]
    types += [1] * len(learned)
    scores = [0.0] * 259 + [-float(i) for i in range(len(learned))]
    return tokens, scores, types


def write_spm_gguf(path: Path) -> Path:
    import gguf

    tokens, scores, types = spm_vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_chat_template("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n"
                        "{% endfor %}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
