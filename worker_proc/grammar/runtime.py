"""Rank 0's grammar runtime: GrammarInit in, GrammarReady out; a token mask for every step
with constrained rows; the matchers fed with the tokens of each step, in order.

The step loop of a pipelined worker launches step n+1 before it has step n's tokens. A mask
for step n+1 needs them, so `before_sample` (called after step n+1's forward is queued, just
before its sampling) waits for the earlier steps' tokens and feeds them to the matchers: the
device runs step n+1's forward meanwhile, and only the sampling of n+1 is queued behind the
mask. A step without constrained rows waits for nothing.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tessera.bus.messages import ForwardBatch, GrammarInit, GrammarReady, SampledTokens
from tessera.worker_proc.grammar.compiler import GrammarCompileError, GrammarCompiler
from tessera.worker_proc.grammar.matchers import MatcherTable

log = logging.getLogger(__name__)


@dataclass
class TokenMask:
    """What the sampler applies through the HAL op `apply_token_mask`."""

    bitmask: torch.Tensor  # int32 [G, W] on the device
    rows: torch.Tensor  # int64 [G]: rows of the step's logits (sampling rows, in order)


@dataclass
class StepGrammar:
    """The constrained rows of one launched step, until its tokens are fed to the matchers."""

    step: int
    positions: np.ndarray  # positions among the step's sampled rows
    gids: list[int]
    fetch: Callable[[], np.ndarray]  # the step's sampled tokens (waits for the device)
    ends: np.ndarray  # SampledTokens.grammar_end of the step (length: sampled rows)
    fed: bool = False


class GrammarRuntime:
    def __init__(self, compiler: GrammarCompiler, vocab_size: int,
                 to_device: Callable[[np.ndarray, torch.dtype], torch.Tensor]) -> None:
        self.compiler = compiler
        self.table = MatcherTable(vocab_size)
        self._to_device = to_device
        self._compiling: list[tuple[GrammarInit, Future[Any]]] = []
        self._steps: deque[StepGrammar] = deque()
        self._done: dict[int, np.ndarray] = {}  # step -> grammar_end, until its answer leaves
        self.masked_rows = 0

    # -- control: GrammarInit -> GrammarReady --------------------------------------------
    def init(self, msg: GrammarInit) -> None:
        self._compiling.append((msg, self.compiler.submit(msg.grammar)))

    @property
    def compiling(self) -> bool:
        return bool(self._compiling)

    def ready(self) -> list[GrammarReady]:
        """Replies for the compiles that have finished (matchers made for the good ones)."""
        done, still = [], []
        for msg, future in self._compiling:
            if not future.done():
                still.append((msg, future))
                continue
            try:
                compiled = future.result()
                self.table.create(msg.first_id, msg.count, compiled)
                done.append(GrammarReady(first_id=msg.first_id))
            except GrammarCompileError as exc:
                done.append(GrammarReady(first_id=msg.first_id, error=str(exc)))
            except Exception as exc:  # noqa: BLE001 - any failure must reach the request
                log.exception("grammar %d could not be prepared", msg.first_id)
                done.append(GrammarReady(first_id=msg.first_id,
                                         error=f"{msg.grammar.param}: structured output is not "
                                               f"available: {exc}"))
        self._compiling = still
        return done

    # -- steps --------------------------------------------------------------------------------
    def free(self, batch: ForwardBatch) -> None:
        if batch.grammar_free.shape[0]:
            self.table.free(batch.grammar_free)

    def before_sample(self, batch: ForwardBatch, sel: np.ndarray
                      ) -> tuple[TokenMask | None, StepGrammar | None]:
        """The mask of this step's constrained sampling rows (`sel`: the batch's sampling
        rows), and the record to pass to `after_sample`."""
        if not batch.grammar_ids.shape[0] or not sel.shape[0]:
            return None, None
        gids_sel = np.asarray(batch.grammar_ids, dtype=np.int64)[sel]
        positions = np.flatnonzero(gids_sel >= 0)
        if not positions.shape[0]:
            return None, None
        self.feed_all()  # every earlier step's tokens into the matchers
        gids = gids_sel[positions].tolist()
        output_lens = np.asarray(batch.output_lens, dtype=np.int64)[sel][positions].tolist()
        plan = self.table.masks(gids, output_lens)
        ends = np.zeros(sel.shape[0], dtype=np.uint8)
        ends[positions[plan.failed]] = SampledTokens.GRAMMAR_FAILED
        record = StepGrammar(batch.step, positions, gids, lambda: np.zeros(0, np.int32), ends)
        if not plan.rows:
            return None, record
        self.masked_rows += len(plan.rows)
        rows = positions[plan.rows]
        mask = TokenMask(bitmask=self._to_device(plan.bitmask, torch.int32),
                         rows=self._to_device(rows.astype(np.int64), torch.int64))
        return mask, record

    def after_sample(self, record: StepGrammar | None,
                     fetch: Callable[[], np.ndarray]) -> None:
        """The step's sampling is queued: its tokens (from `fetch`) feed the matchers later."""
        if record is not None:
            record.fetch = fetch
            self._steps.append(record)

    def feed_all(self) -> None:
        while self._steps:
            self._feed(self._steps.popleft())

    def _feed(self, record: StepGrammar) -> None:
        if record.fed:
            return
        record.fed = True
        tokens = record.fetch()
        failed = record.ends[record.positions] == SampledTokens.GRAMMAR_FAILED
        keep = ~failed
        ends = self.table.accept([g for g, k in zip(record.gids, keep, strict=True) if k],
                                 tokens[record.positions[keep]].tolist())
        record.ends[record.positions[keep]] = ends
        self._done[record.step] = record.ends

    def step_ends(self, step: int) -> np.ndarray:
        """SampledTokens.grammar_end of `step` (empty when it had no constrained rows)."""
        while self._steps and self._steps[0].step <= step:
            self._feed(self._steps.popleft())
        for old in [s for s in self._done if s < step]:  # steps that failed on the way
            del self._done[old]
        return self._done.pop(step, np.zeros(0, dtype=np.uint8))
