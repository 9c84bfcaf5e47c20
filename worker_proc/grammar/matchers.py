"""One xgrammar GrammarMatcher per constrained sample, keyed by the scheduler's matcher id.

A matcher accepts every token this rank samples for its sequence, in step order. The
scheduler may drop a sampled token (its sequence was retracted or aborted while the step was
in flight), so before each mask the matcher is brought back to the scheduler's count of
output tokens (`ForwardBatch.output_lens`) by rolling back what it accepted beyond it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from tessera.bus.messages import SampledTokens

log = logging.getLogger(__name__)


@dataclass
class Slot:
    matcher: Any  # xgrammar.GrammarMatcher
    accepted: int = 0  # tokens accepted (the stop token included)


@dataclass
class MaskPlan:
    """Bitmasks for the rows of a step that need one.

    bitmask int32 [G, W]: row g allows the tokens whose bits are set; rows: which of the
    step's constrained rows (positions in the caller's list) the G masks belong to; failed:
    positions whose matcher is out of step (their requests are failed).
    """

    bitmask: np.ndarray
    rows: list[int]
    failed: list[int]


class MatcherTable:
    def __init__(self, vocab_size: int, fill_threads: int | Literal["auto"] = "auto") -> None:
        self.words = (vocab_size + 31) // 32
        self.slots: dict[int, Slot] = {}
        self._fill_threads = fill_threads
        self._batch: Any = None

    def create(self, first_id: int, count: int, compiled: Any) -> None:
        import xgrammar as xgr

        for gid in range(first_id, first_id + count):
            self.slots[gid] = Slot(xgr.GrammarMatcher(compiled))

    def free(self, ids: np.ndarray | list[int]) -> None:
        for gid in np.asarray(ids, dtype=np.int64).tolist():
            self.slots.pop(gid, None)

    def masks(self, gids: list[int], output_lens: list[int]) -> MaskPlan:
        """Masks for the next token of each of `gids` (sequences with `output_lens` tokens)."""
        import xgrammar as xgr

        rows: list[int] = []
        matchers: list[Any] = []
        failed: list[int] = []
        for pos, (gid, want) in enumerate(zip(gids, output_lens, strict=True)):
            slot = self.slots.get(gid)
            if slot is None:
                log.error("grammar matcher %d is unknown: failing its request", gid)
                failed.append(pos)
                continue
            if slot.accepted > want:
                slot.matcher.rollback(slot.accepted - want)
                slot.accepted = want
            elif slot.accepted < want:
                log.error("grammar matcher %d accepted %d tokens, the sequence has %d: failing "
                          "its request", gid, slot.accepted, want)
                failed.append(pos)
                continue
            if slot.matcher.is_terminated():
                continue  # its stop token is in flight: this token will be dropped anyway
            rows.append(pos)
            matchers.append(slot.matcher)
        bitmask = np.empty((len(rows), self.words), dtype=np.int32)
        if matchers:
            if self._batch is None:
                self._batch = xgr.BatchGrammarMatcher(self._fill_threads)
            self._batch.batch_fill_next_token_bitmask(matchers, bitmask)
        return MaskPlan(bitmask, rows, failed)

    def accept(self, gids: list[int], tokens: list[int]) -> np.ndarray:
        """Feed each matcher its sampled token; SampledTokens.grammar_end values per position."""
        ends = np.zeros(len(gids), dtype=np.uint8)
        for pos, (gid, token) in enumerate(zip(gids, tokens, strict=True)):
            slot = self.slots.get(gid)
            if slot is None or slot.matcher.is_terminated():
                continue  # freed, or finished: the scheduler drops this token
            if not slot.matcher.accept_token(int(token)):
                log.error("grammar matcher %d rejected token %d, which its own mask allowed",
                          gid, token)
                ends[pos] = SampledTokens.GRAMMAR_FAILED
                continue
            slot.accepted += 1
            if slot.matcher.is_terminated():
                ends[pos] = SampledTokens.GRAMMAR_DONE
        return ends
