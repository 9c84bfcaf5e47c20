"""The grammar engine's view of the model's vocabulary (xgrammar's TokenizerInfo), built from
the same tokenizer files the tokenizer process reads."""

from __future__ import annotations

from typing import Any


class GrammarUnavailable(RuntimeError):
    """Structured output cannot work for this model (the message says why)."""


def tokenizer_info(model: str, vocab_size: int, stop_token_ids: list[int]) -> Any:
    """xgrammar.TokenizerInfo of `model` for logits of width `vocab_size`: token ids beyond the
    tokenizer's own vocabulary (padding) are never allowed; the stop tokens end a grammar."""
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    from tessera.formats.tokenizer import load_tokenizer

    tok = load_tokenizer(model, ids_only_ok=True)
    if tok.backend is None:
        raise GrammarUnavailable(
            f"the model {model} has no tokenizer files (dummy weights from a config), and "
            f"structured output needs its vocabulary: give a model folder with tokenizer.json")
    hf = PreTrainedTokenizerFast(tokenizer_object=tok.backend)
    stops = sorted(set(stop_token_ids) | set(tok.eos_token_ids))
    return xgr.TokenizerInfo.from_huggingface(hf, vocab_size=max(vocab_size, tok.vocab_size),
                                              stop_token_ids=stops)
