"""Tensor-parallel sharding: which slice of each full (HF) tensor a rank keeps.

Megatron layout, as in SGLang/vLLM:
  column-parallel  q/k/v, gate/up: output rows split by rank (heads stay whole)
  row-parallel     o, down: input columns split by rank; the partial outputs are summed with
                   communicator.all_reduce right after the matmul
  vocab-parallel   lm_head: vocabulary rows split by rank (padded to a multiple of tp_size);
                   the logits are all_gathered. The embedding is replicated: it is small next
                   to the layers and a replicated lookup needs no collective.
KV heads: with tp_size > num_kv_heads each KV head is replicated on tp_size / num_kv_heads
ranks (GQA keeps working because each rank's query heads map onto its one KV head).

Mixture-of-Experts layers: the tp_size ranks form ep_size expert groups of
moe_tp = tp_size / ep_size ranks. Expert group g holds experts [g * E / ep_size, ...), and
inside a group every expert's intermediate dimension is split like a dense MLP's. Each rank
computes its partial sum over the tokens' chosen experts it holds; one all_reduce over all
tp_size ranks sums them (ep_size == 1: pure TP; ep_size == tp_size: whole experts per rank).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.formats.config import ModelConfig
from tessera.formats.parallel import tp_problem


@dataclass(frozen=True)
class TPShape:
    """Per-rank sizes of a sharded model. tp_size == 1 gives the full model."""

    rank: int
    size: int
    num_heads: int  # query heads on this rank
    num_kv_heads: int  # KV heads on this rank
    kv_head_start: int  # first full-model KV head this rank holds
    intermediate: int  # MLP rows on this rank
    vocab_padded: int  # full vocabulary rounded up to a multiple of size
    vocab_local: int
    ep_size: int = 1
    ep_rank: int = 0  # this rank's expert group
    moe_tp_size: int = 1  # ranks sharing each expert
    moe_tp_rank: int = 0

    @classmethod
    def of(cls, config: ModelConfig, rank: int, size: int, ep_size: int = 1) -> TPShape:
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"bad tensor-parallel rank {rank} of {size}")
        problem = tp_problem(config, size, ep_size)
        if problem:
            raise ValueError(problem)
        kv = config.num_kv_heads
        moe_tp = size // ep_size
        if kv >= size:
            kv_local, kv_start = kv // size, rank * (kv // size)
        else:
            kv_local, kv_start = 1, rank // (size // kv)
        vocab_padded = -(-config.vocab_size // size) * size
        return cls(rank=rank, size=size, num_heads=config.num_heads // size,
                   num_kv_heads=kv_local, kv_head_start=kv_start,
                   intermediate=config.intermediate_size // size,
                   vocab_padded=vocab_padded, vocab_local=vocab_padded // size,
                   ep_size=ep_size, ep_rank=rank // moe_tp, moe_tp_size=moe_tp,
                   moe_tp_rank=rank % moe_tp)
