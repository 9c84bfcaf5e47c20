"""Speculative decoding, the scheduler's part: which decodes verify proposals this step, how
many slots they take, and what their results change.

A decode that speculates sends its step's token followed by k proposed tokens (`Drafts`);
the worker runs all k + 1 in one forward over the paged KV, samples after each, and keeps the
longest run of proposals equal to its samples plus the sample after it (ForwardBatch
.draft_lens, SampledTokens.counts). So the output is the target model's own, whatever is
proposed: greedy rows get exactly their greedy tokens, sampled rows their distribution.

Proposers share one small interface (`Proposer`): `propose` gives proposals for sequences
whose tokens are all known, `wants` says whether a sequence with a token still in flight
would get some once it is known. `NgramProposer` proposes here, from the tokens the scheduler
keeps; `WorkerProposer` only reserves the slots, and the worker's draft model (or a later
EAGLE-style head) writes the proposals on the device.

Overlap. Step n+1 is built before step n's result is read; for a plain decode the scheduler
knows where its next token goes (one token per step), for a verify it does not (1 to k + 1
tokens). A sequence whose verify is in flight and whose last verify kept every proposal
verifies again in the step built meanwhile, *chained* on the guess that this one keeps every
proposal too (SGLang's overlapped "spec v2" guesses the same way): its input is the token the
verify in flight samples last (id -1, resolved on the worker), at the position after all its
proposals, and its proposals continue the known tokens followed by the proposals in flight
(`Proposer.propose_chained`; the token in flight is guessed too, by the same lookup). If the
verify in flight then keeps fewer tokens, the chained step's part for that sequence is void:
its result is ignored (its in-flight record forgets the sequence), its KV slots are rolled
back with the rejected proposals', and the sequence is planned again from what it knows. Only
a proposer that proposes on the host chains (`chains`); the draft model proposes on the
worker from tokens it has seen, so its sequences sit out the step built while their verify
runs and are planned again once its result is in.

A plain decode whose proposer `wants` to speculate after the token in flight is held for one
step, so it proposes with that token known. Sequences without proposals keep decoding one
token per step, overlapped as before, at the cost of one suffix lookup each.

Not speculated (they decode one token a step): requests with penalties (their sampling needs
the history of every position), a grammar, min_tokens still to reach, and a sequence too
close to its length limit for one proposal. A sequence whose proposals were all rejected
proposes again only after 1, 2, 4, ... 32 plain steps (the back-off resets on an accepted
proposal), so text that does not repeat costs almost nothing.

Pages: a verify's k + 1 slots are allocated when it is planned (`extra_pages`); its result
sets the KV length to what was accepted and frees the pages past it (`rollback`). When pages
are short, proposals are dropped before anyone is retracted.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from tessera.scheduler_proc.config import SchedulerConfig
from tessera.scheduler_proc.ngram import NgramIndex, continuation
from tessera.scheduler_proc.rows import RowState

MAX_BACKOFF = 32


@dataclass
class Drafts:
    """The proposals of one step: `lens[i]` tokens for row `rows[i]`, concatenated in
    `tokens` (placeholders when the worker proposes)."""

    rows: np.ndarray  # int32
    lens: np.ndarray  # int32, each >= 1
    tokens: np.ndarray  # int32 [lens.sum()]

    @property
    def count(self) -> int:
        return int(self.rows.shape[0])


@dataclass
class SpecStats:
    verify_steps: int = 0  # sequence-steps that verified proposals (void chained ones not)
    draft_tokens: int = 0  # tokens proposed
    accepted_tokens: int = 0  # of which accepted
    chained_steps: int = 0  # sequence-steps planned while the sequence's verify was in flight
    void_steps: int = 0  # of which void: that verify kept fewer tokens than it proposed

    @property
    def accept_length(self) -> float:
        """Tokens a verifying sequence gains per step (accepted proposals + its own)."""
        if not self.verify_steps:
            return 0.0
        return (self.accepted_tokens + self.verify_steps) / self.verify_steps


class Proposer(ABC):
    """Proposes continuations for running sequences (rows of `RowState`)."""

    fills_on_worker = False  # the proposals sent are placeholders the worker overwrites
    chains = False  # proposes after proposals still in flight (propose_chained)

    def __init__(self, st: RowState, k: int) -> None:
        self.st = st
        self.k = k

    @abstractmethod
    def propose(self, rows: np.ndarray, limits: np.ndarray) -> Drafts:
        """Proposals for `rows` (every token known), at most `limits[i]` (>= 1) for rows[i];
        rows may be left out."""

    @abstractmethod
    def wants(self, rows: np.ndarray) -> np.ndarray:
        """bool per row (its last token in flight): whether it would propose once the token
        is known."""

    def propose_chained(self, rows: np.ndarray, limits: np.ndarray) -> Drafts:
        """Proposals for `rows`, each with a verify in flight, after the known tokens and
        that verify's proposals (RowState.tokens[:kv_len]) and a guess of the token it samples
        after them, which is written at tokens[kv_len] (room the chained step's input takes;
        the worker resolves the real token). Only for a proposer with `chains`."""
        raise NotImplementedError(f"{type(self).__name__} does not chain")


class NgramProposer(Proposer):
    chains = True

    def __init__(self, st: RowState, k: int, min_n: int, max_n: int) -> None:
        super().__init__(st, k)
        self.min_n, self.max_n = min_n, max_n
        n_rows = st.uid.shape[0]
        self.indexes: list[NgramIndex | None] = [None] * n_rows
        self.owner = np.full(n_rows, -1, dtype=np.int64)  # uid the index was built for

    def _index(self, row: int) -> NgramIndex:
        st = self.st
        index = self.indexes[row]
        if index is None or self.owner[row] != st.uid[row]:
            index = self.indexes[row] = NgramIndex(self.min_n, self.max_n)
            self.owner[row] = st.uid[row]
        index.catch_up(st.tokens[row], int(st.n_known[row]))
        return index

    def propose(self, rows: np.ndarray, limits: np.ndarray) -> Drafts:
        return self._lookup(rows, limits, chained=False)

    def wants(self, rows: np.ndarray) -> np.ndarray:
        st = self.st
        out = np.zeros(rows.shape[0], dtype=bool)
        for i, row in enumerate(rows.tolist()):
            out[i] = self._index(row).match(st.tokens[row], int(st.n_known[row])) >= 0
        return out

    def propose_chained(self, rows: np.ndarray, limits: np.ndarray) -> Drafts:
        return self._lookup(rows, limits, chained=True)

    def _lookup(self, rows: np.ndarray, limits: np.ndarray, chained: bool) -> Drafts:
        """Proposals after each row's known tokens. Chained: the token in flight is guessed
        by the same lookup and written after them (a proposal still in flight may be
        rejected, so only the known tokens are indexed)."""
        st = self.st
        guess = 1 if chained else 0  # the token in flight, guessed ahead of the proposals
        got_rows: list[int] = []
        lens: list[int] = []
        parts: list[np.ndarray] = []
        for row, limit in zip(rows.tolist(), limits.tolist(), strict=True):
            length = int(st.kv_len[row] if chained else st.n_known[row])
            pos = self._index(row).match(st.tokens[row], length)
            if pos < 0:
                continue
            count = min(self.k, limit)
            cont = continuation(st.tokens[row], length, pos, count + guess)
            if chained:
                st.tokens[row, length] = cont[0]
            got_rows.append(row)
            lens.append(count)
            parts.append(cont[guess:])
        return Drafts(np.array(got_rows, dtype=np.int32), np.array(lens, dtype=np.int32),
                      np.concatenate(parts).astype(np.int32) if parts
                      else np.zeros(0, dtype=np.int32))


class WorkerProposer(Proposer):
    """Proposals made on the worker (its draft model): every eligible row proposes as many
    tokens as it may; the ids sent are placeholders."""

    fills_on_worker = True

    def propose(self, rows: np.ndarray, limits: np.ndarray) -> Drafts:
        lens = np.minimum(limits, self.k).astype(np.int32)
        return Drafts(rows.astype(np.int32), lens, np.zeros(int(lens.sum()), dtype=np.int32))

    def wants(self, rows: np.ndarray) -> np.ndarray:
        return np.ones(rows.shape[0], dtype=bool)


def make_proposer(config: SchedulerConfig, st: RowState) -> Proposer | None:
    algo, k = config.speculative_algorithm, config.speculative_num_draft_tokens
    if algo == "none":
        return None
    if algo == "ngram":
        return NgramProposer(st, k, config.speculative_ngram_min, config.speculative_ngram_max)
    if algo == "draft":
        return WorkerProposer(st, k)
    raise ValueError(f"unknown speculative algorithm {algo!r}")


class Speculation:
    """The planner's and the scheduler's side of speculative decoding (see the module doc)."""

    def __init__(self, proposer: Proposer, st: RowState) -> None:
        self.proposer = proposer
        self.st = st
        n_rows = st.uid.shape[0]
        self.fails = np.zeros(n_rows, dtype=np.int32)  # verifies in a row that accepted none
        self.resume_at = np.zeros(n_rows, dtype=np.int64)  # step from which it may propose
        self.owner = np.full(n_rows, -1, dtype=np.int64)  # uid the back-off belongs to
        self.held = np.zeros(n_rows, dtype=bool)  # held last time for its token in flight
        self.full = np.zeros(n_rows, dtype=bool)  # its last verify kept every proposal
        self.stats = SpecStats()

    def _eligible(self, rows: np.ndarray, step: int) -> np.ndarray:
        st = self.st
        stale = self.owner[rows] != st.uid[rows]
        if stale.any():
            fresh = rows[stale]
            self.fails[fresh] = 0
            self.resume_at[fresh] = 0
            self.held[fresh] = False
            self.full[fresh] = False
            self.owner[fresh] = st.uid[fresh]
        n = st.n_known[rows]
        return (~st.has_penalty[rows] & (st.grammar_id[rows] < 0)
                & (n - st.prompt_len[rows] >= st.min_tokens[rows])
                & (self.resume_at[rows] <= step))

    def plan(self, rows: np.ndarray, step: int) -> tuple[np.ndarray, Drafts | None]:
        """Of the decode-ready `rows`: the rows that decode this step (those held for their
        token in flight left out) and the proposals of those that verify."""
        st = self.st
        ok = self._eligible(rows, step)
        if not ok.any():
            return rows, None
        pending = st.pending[rows] > 0
        # Room for k + 1 new tokens: n_known + lens + 1 <= max_total.
        room = st.max_total[rows] - st.n_known[rows] - st.pending[rows] - 1
        ok &= room >= 1
        hold = ok & pending
        if hold.any():
            held = rows[hold]
            wanted = self.proposer.wants(held)
            self.held[held[wanted]] = True
            keep = np.ones(rows.shape[0], dtype=bool)
            keep[np.flatnonzero(hold)[wanted]] = False
            rows, ok, room = rows[keep], ok[keep], room[keep]
            pending = pending[keep]
        ready = ok & ~pending
        if not ready.any():
            return rows, None
        asked = rows[ready]
        drafts = self.proposer.propose(asked, room[ready])
        if self.held[asked].any():
            # Held for a token that then matched nothing: a miss, like a rejected proposal
            # (a sequence must not alternate between held and plain steps).
            missed = asked[self.held[asked] & ~np.isin(asked, drafts.rows)]
            self._back_off(missed, step - 1)
            self.held[asked] = False
        return rows, drafts if drafts.count else None

    def chain(self, rows: np.ndarray, step: int) -> Drafts | None:
        """Of the running `rows`: proposals for those whose verify is in flight (nothing else
        of them: pending 1, KV scheduled past their known tokens) and kept every proposal
        last time, chained after it (see the module doc); None when there are none."""
        st = self.st
        if not self.proposer.chains or not rows.shape[0]:
            return None
        rows = rows[(st.pending[rows] == 1) & (st.kv_len[rows] > st.n_known[rows])]
        if not rows.shape[0]:
            return None
        rows = rows[self._eligible(rows, step) & self.full[rows]]
        # Room for the token in flight, the chained input and its proposals:
        # kv_len + 1 + lens + 1 <= max_total.
        room = st.max_total[rows] - st.kv_len[rows] - 2
        rows, room = rows[room >= 1], room[room >= 1]
        if not rows.shape[0]:
            return None
        drafts = self.proposer.propose_chained(rows, room)
        return drafts if drafts.count else None

    def on_verified(self, rows: np.ndarray, drafted: np.ndarray, accepted: np.ndarray,
                    step: int) -> None:
        """Results of verify rows (still bound): back-off and counters."""
        self.full[rows] = accepted == drafted
        self.stats.verify_steps += int(rows.shape[0])
        self.stats.draft_tokens += int(drafted.sum())
        self.stats.accepted_tokens += int(accepted.sum())
        none = accepted == 0
        self.fails[rows[~none]] = 0
        self.resume_at[rows[~none]] = 0
        self._back_off(rows[none], step)

    def _back_off(self, rows: np.ndarray, step: int) -> None:
        if rows.shape[0]:
            self.fails[rows] += 1
            wait = np.minimum(1 << np.minimum(self.fails[rows] - 1, 5), MAX_BACKOFF)
            self.resume_at[rows] = step + 1 + wait


def merge(a: Drafts | None, b: Drafts) -> Drafts:
    """The proposals of `a` (None: none) and `b` (rows of neither in the other)."""
    if a is None:
        return b
    return Drafts(np.concatenate([a.rows, b.rows]), np.concatenate([a.lens, b.lens]),
                  np.concatenate([a.tokens, b.tokens]))


def extra_pages(st: RowState, rows: np.ndarray, extend: np.ndarray) -> np.ndarray:
    """Pages each row needs for `extend` more tokens."""
    ps = st.page_size
    return (st.kv_len[rows] + extend + ps - 1) // ps - st.n_pages[rows]


def rollback(st: RowState, row: int, kv_len: int, free: list[np.ndarray]) -> None:
    """A verify accepted fewer tokens than it wrote: the row's KV ends at `kv_len`; its own
    pages past that go to `free`."""
    ps = st.page_size
    st.kv_len[row] = kv_len
    st.kv_done[row] = kv_len
    keep = -(-kv_len // ps)
    n_pages = int(st.n_pages[row])
    if n_pages > keep:
        free.append(st.pages[row, keep:n_pages].copy())
        st.n_pages[row] = keep
