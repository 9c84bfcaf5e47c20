"""`apply_token_mask` (semantics: hal/ops.py) as one Triton kernel: program (g, block) reads
BLOCK logits of row rows[g] and the mask words that cover them, and writes -inf only where
a token is forbidden, so allowed logits are never rewritten."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _token_mask_kernel(logits_ptr, mask_ptr, rows_ptr, logits_s0, mask_s0, vocab, words,
                       BLOCK: tl.constexpr):
    g = tl.program_id(0).to(tl.int64)
    idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = idx < vocab
    word_idx = idx // 32
    has_word = in_vocab & (word_idx < words)
    word = tl.load(mask_ptr + g * mask_s0 + word_idx, mask=has_word, other=0)
    allowed = ((word >> (idx % 32)) & 1) != 0
    row = tl.load(rows_ptr + g).to(tl.int64)
    tl.store(logits_ptr + row * logits_s0 + idx, float("-inf"), mask=in_vocab & ~allowed)


def apply_token_mask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    groups = rows.shape[0]
    if groups == 0:
        return
    vocab = logits.shape[1]
    assert logits.stride(1) == 1, "apply_token_mask needs rows of contiguous logits"
    mask = bitmask.to(device=logits.device, dtype=torch.int32).contiguous()
    rows = rows.to(device=logits.device).contiguous()
    _token_mask_kernel[(groups, triton.cdiv(vocab, BLOCK))](
        logits, mask, rows, logits.stride(0), mask.stride(0), vocab, mask.shape[1],
        BLOCK=BLOCK)
