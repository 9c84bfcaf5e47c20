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
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.formats.config import ModelConfig


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

    @classmethod
    def of(cls, config: ModelConfig, rank: int, size: int) -> TPShape:
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"bad tensor-parallel rank {rank} of {size}")
        problems = []
        if config.num_heads % size:
            problems.append(f"num_attention_heads ({config.num_heads})")
        if config.intermediate_size % size:
            problems.append(f"intermediate_size ({config.intermediate_size})")
        kv = config.num_kv_heads
        if (kv % size) if kv >= size else (size % kv):
            problems.append(f"num_key_value_heads ({kv})")
        if problems:
            raise ValueError(f"--tp-size {size} does not divide {', '.join(problems)}; "
                             f"choose a tp size that divides them")
        if kv >= size:
            kv_local, kv_start = kv // size, rank * (kv // size)
        else:
            kv_local, kv_start = 1, rank // (size // kv)
        vocab_padded = -(-config.vocab_size // size) * size
        return cls(rank=rank, size=size, num_heads=config.num_heads // size,
                   num_kv_heads=kv_local, kv_head_start=kv_start,
                   intermediate=config.intermediate_size // size,
                   vocab_padded=vocab_padded, vocab_local=vocab_padded // size)
