"""The running set: which sequence holds which page-table row, and the moves in and out.

    bind(seq, prefix, node)   a waiting sequence takes a free row, starting from cached pages
    unbind(seq, insert)       it leaves (finish, abort, retraction): pages to the cache or the
                              free list at once, the row only once no step in flight names it
    retract(seq)              unbind and requeue; it recomputes when it comes back

Pages of a sequence that stops are freed or handed to the cache at once: any step built later
runs after the steps in flight, so a page is never reused too early. Rows are different: a
row may be rewritten only once no step in flight names it (`_release_row`).
"""

from __future__ import annotations

import logging

import numpy as np

from tessera.scheduler_proc.kv_pool import KVPool
from tessera.scheduler_proc.page_table import RowPool
from tessera.scheduler_proc.policy import WaitingQueue, retraction_victim
from tessera.scheduler_proc.radix_cache import Node
from tessera.scheduler_proc.request import SeqState, Sequence
from tessera.scheduler_proc.rows import RowState

log = logging.getLogger(__name__)


class PrefixesInFlight:
    """First pages (as bytes) that running sequences are computing and that are not in the
    cache yet. A waiting sequence with the same first page waits for it instead of computing
    it again."""

    def __init__(self) -> None:
        self.counts: dict[bytes, int] = {}

    def __contains__(self, key: bytes) -> bool:
        return key in self.counts

    def add(self, seq: Sequence, key: bytes) -> None:
        seq.pending_key = key
        self.counts[key] = self.counts.get(key, 0) + 1

    def ready(self, seq: Sequence) -> None:
        """The sequence's first page is cached, or it stopped: stop holding others back."""
        key = seq.pending_key
        if key is None:
            return
        seq.pending_key = None
        left = self.counts[key] - 1
        if left:
            self.counts[key] = left
        else:
            del self.counts[key]

    def total(self) -> int:
        return sum(self.counts.values())


class RunningSet:
    def __init__(self, st: RowState, kv: KVPool, waiting: WaitingQueue, by_priority: bool
                 ) -> None:
        n_rows = st.uid.shape[0]
        self.st, self.kv, self.waiting = st, kv, waiting
        self.page_size = st.page_size
        self.by_priority = by_priority
        self.prefixes = PrefixesInFlight()
        self.row_pool = RowPool(n_rows)
        self.seqs: dict[int, Sequence] = {}  # row -> sequence
        self.seq_of_row: list[Sequence | None] = [None] * n_rows
        self.rid_of_row: list[str] = [""] * n_rows
        self.fork_rows: set[int] = set()  # rows of index-0 sequences with parked siblings
        self.deferred_rows: list[int] = []  # left, but a step in flight still reads them
        self.completed_step = -1  # every step up to this one has come back
        self._active: np.ndarray | None = None  # rows of `seqs`, rebuilt when it changes
        self._uid = 0

    def __len__(self) -> int:
        return len(self.seqs)

    def active_rows(self) -> np.ndarray:
        """Rows of the running sequences (cached until the running set changes)."""
        if self._active is None:
            self._active = np.fromiter(self.seqs, dtype=np.int32, count=len(self.seqs))
        return self._active

    def bind(self, seq: Sequence, prefix: np.ndarray, node: Node) -> None:
        """Give a waiting sequence a row, starting from `prefix` (cache pages, locked by
        `node`)."""
        st = self.st
        row = self.row_pool.alloc()
        req = seq.req
        st.bind(row, self._uid, seq.tokens, req.prompt_len, req.max_total, req.sampling,
                seq.index, bool(req.stop_ids), seq.grammar_id)
        self._uid += 1
        st.set_prefix(row, prefix)
        if seq.cached_tokens < 0:
            seq.cached_tokens = int(prefix.shape[0]) * self.page_size
        st.cached[row] = seq.cached_tokens
        seq.row, seq.uid, seq.state = row, int(st.uid[row]), SeqState.RUNNING
        seq.last_node = node
        self.seq_of_row[row] = seq
        self.rid_of_row[row] = req.rid
        st.fresh[row] = not req.announced
        self.seqs[row] = seq
        self._active = None
        if seq.index == 0 and seq.req.fork_pending:
            self.fork_rows.add(row)

    def unbind(self, seq: Sequence, insert: bool) -> None:
        row = seq.row
        self.prefixes.ready(seq)
        self.kv.release(seq, insert)
        del self.seqs[row]
        self._active = None
        self.fork_rows.discard(row)
        self.st.unbind(row)
        self.seq_of_row[row] = None
        seq.row = -1
        self._release_row(row)

    def victim(self) -> Sequence:
        """The running sequence that gives way first when memory runs out."""
        victim = retraction_victim(self.seqs.values(), self.by_priority)
        assert victim is not None
        return victim

    def retract(self, seq: Sequence) -> None:
        """Free a running sequence's pages and requeue it; it recomputes when it returns."""
        row = seq.row
        seq.tokens = self.st.tokens[row, :self.st.n_known[row]].copy()
        self.unbind(seq, insert=True)
        self.waiting.push(seq)
        log.debug("retracted %s[%d] (%d tokens)", seq.req.rid, seq.index, seq.tokens.shape[0])

    def step_completed(self, step: int) -> None:
        """The worker is done with every step up to `step` (it runs them in order): the rows
        they named may be reused."""
        self.completed_step = step
        self.release_deferred_rows()

    def _release_row(self, row: int) -> None:
        if int(self.st.last_step[row]) > self.completed_step:
            self.deferred_rows.append(row)  # a step in flight still reads this row
        else:
            self.row_pool.free(row)

    def release_deferred_rows(self) -> None:
        if not self.deferred_rows:
            return
        still = []
        for row in self.deferred_rows:
            if int(self.st.last_step[row]) > self.completed_step:
                still.append(row)
            else:
                self.row_pool.free(row)
        self.deferred_rows = still
