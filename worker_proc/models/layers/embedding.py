"""The token embedding (replicated on every rank) and the vocabulary-parallel LM head."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from tessera.worker_proc.models.layers.linear import Linear, OutputPart
from tessera.worker_proc.models.layers.params import materialize, meta_param

if TYPE_CHECKING:
    from tessera.worker_proc.models.context import ModelContext


class VocabEmbedding(nn.Module):
    """Replicated: it is small next to the layers and a replicated lookup needs no
    collective."""

    def __init__(self, ctx: ModelContext, vocab: int, hidden: int) -> None:
        super().__init__()
        self.ctx = ctx
        self.weight = meta_param(vocab, hidden)
        self.embedding_op = ctx.op("embedding")

    def load(self, param: str, tensor: torch.Tensor, part: str | None = None) -> None:
        del param, part
        materialize(self, "weight", self.ctx.dtype, self.ctx.device).copy_(tensor)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding_op(ids, self.weight)  # type: ignore[no-any-return]


class LMHead(nn.Module):
    """Vocabulary rows split across ranks (padded to a multiple of the TP size); the logits
    are all-gathered and the padding cut off."""

    def __init__(self, ctx: ModelContext, vocab: int, hidden: int, *,
                 shares_table: bool = False) -> None:
        """`shares_table`: tie() will make the embedding table the head (one rank holding the
        whole model); otherwise the head has rows of its own, a tied model's copied from the
        embedding's checkpoint tensor."""
        super().__init__()
        tp = ctx.tp
        self.ctx, self.vocab = ctx, vocab
        self.shares_table = shares_table
        lo = min(tp.rank * tp.vocab_local, vocab)
        hi = min(lo + tp.vocab_local, vocab)
        self.proj = Linear.column(ctx, hidden, [OutputPart(None, 0, lo, hi - lo)],
                                  out_features=tp.vocab_local,
                                  role="tied_lm_head" if shares_table else "lm_head")

    def tie(self, embedding: VocabEmbedding) -> None:
        """Share the embedding table as the head (one rank: the same rows)."""
        assert self.shares_table and self.ctx.tp.size == 1
        self.proj.weight = embedding.weight

    def load(self, param: str, tensor: torch.Tensor, part: str | None = None) -> None:
        self.proj.load(param, tensor, part)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.proj(h)
        if self.ctx.tp.size > 1:
            logits = self.ctx.all_gather(logits, dim=-1)[:, : self.vocab]
        return logits
