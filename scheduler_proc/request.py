"""Request state: one `Request` per TokenizedRequest, one `Sequence` per sample index.

While a sequence runs, its numbers live in the row-indexed arrays of `RowState` (so a decode
step touches them with numpy, not per request in Python); the objects here hold what is not
on the hot path. A sequence that is not bound to a row (waiting, retracted) keeps its known
tokens in `Sequence.tokens`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from tessera.bus.messages import DetokInfo, SamplingParams
from tessera.scheduler_proc.radix_cache import Node


class SeqState(enum.Enum):
    PARKED = 0  # n > 1: sample index k > 0 waits for index 0's prefill (then shares its pages)
    WAITING = 1
    RUNNING = 2
    FINISHED = 3


@dataclass(eq=False)
class Request:
    rid: str
    prompt: np.ndarray  # int32, owned copy
    sampling: SamplingParams
    detok: DetokInfo
    priority: int
    order: int  # arrival order (FCFS tie-break, retraction picks the largest)
    arrival_time: float
    max_total: int  # prompt + output tokens at most ("length" beyond)
    block_ids: np.ndarray  # forbidden while output_len < min_tokens (EOS unless ignore_eos, stops)
    stop_ids: frozenset[int]
    seqs: list[Sequence] = field(default_factory=list)
    fork_pending: list[Sequence] = field(default_factory=list)  # n > 1: after index 0 prefills
    live: int = 0  # sequences not finished
    announced: bool = False  # its DetokInfo went out in a TokenBatch
    queued_at: float = 0.0  # time.monotonic() at admission (request timeout)
    bias_ids: np.ndarray | None = None  # logit_bias token ids (int32), None without a bias
    bias_values: np.ndarray | None = None  # their biases (float32)

    @property
    def prompt_len(self) -> int:
        return int(self.prompt.shape[0])


@dataclass(eq=False)
class Sequence:
    req: Request
    index: int
    tokens: np.ndarray  # known tokens while not bound to a row (prompt, then + outputs)
    state: SeqState = SeqState.PARKED
    row: int = -1
    uid: int = -1  # identifies one binding to a row (a result for an older binding is stale)
    cached_tokens: int = -1  # prefix tokens served from the cache at first admission
    last_node: Node | None = None  # deepest radix node this sequence holds a lock on
    queued: int = 0  # bumps on every (re)queue: heap entries with an older value are stale
    pending_key: bytes | None = None  # first page, while its KV is not in the cache yet
    grammar_id: int = -1  # the worker's grammar matcher of this sample (-1: no grammar)
    prompt_scored: int = 0  # prompt tokens whose logprobs were sent (prompt_logprobs)
    embed_sum: np.ndarray | None = None  # embed "mean": the hidden states summed so far
    prefix_hint: int = 0  # lpm: its tokens found in the cache when the queue was last ranked

    def sort_key(self, by_priority: bool) -> tuple[int, int, int]:
        """Smaller runs first; the largest is retracted first."""
        return (-self.req.priority if by_priority else 0, self.req.order, self.index)
