"""Tensor-parallel ranks skip the all-reduce of the sampled tokens only where each rank's own
draw is certain to equal rank 0's: greedy rows and no grammar mask."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from tessera.worker_proc.model_runner import draws_agree


def batch(temperature: list[float], top_k: list[int], grammars: int = 0) -> SimpleNamespace:
    return SimpleNamespace(temperature=np.array(temperature, np.float32),
                           top_k=np.array(top_k, np.int32),
                           grammar_ids=np.zeros(grammars, np.int32))


def test_greedy_rows_agree_without_rank_zero() -> None:
    assert draws_agree(batch([0.0, 0.0], [0, 0]))
    assert draws_agree(batch([0.0, 0.7], [0, 1]))  # top_k 1 is greedy at any temperature
    assert draws_agree(batch([], []))


def test_a_draw_or_a_grammar_needs_rank_zero_tokens() -> None:
    assert not draws_agree(batch([0.0, 0.7], [0, 0]))  # one row draws
    assert not draws_agree(batch([0.0], [0], grammars=1))  # only rank 0 masks
