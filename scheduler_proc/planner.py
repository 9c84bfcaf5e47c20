"""Choose one step's work: which sequences run, how many tokens each, with which pages.

In order, every step:
  1. decodes: every running sequence whose prompt is in KV takes one token, or with
     speculative decoding verifies that token and its proposals (`speculation.py`: which
     sequences, how many slots; a sequence whose verify is in flight may verify again,
     chained after it). When their new pages do not fit (after evicting unlocked
     cache pages), proposals are dropped, then the youngest running sequence is retracted
     (`policy.retraction_victim`) until they do: decodes never deadlock;
  2. prefill chunks of sequences admitted earlier, under the token budget
     (`Planner.token_budget`: chunked_prefill_size; while streams decode, and are not
     outnumbered by requests awaiting their first token, what keeps the step within
     max_mixed_step_ratio decode steps at the measured costs, or up to
     max_backlog_step_ratio while the prompts awaiting prefill would take more than
     prefill_backlog_steps steps at that budget; about
     step_target_ms of work, as a request may arrive during any step; decodes do not count
     against it, they are planned first and never wait for a prefill). While requests
     wait, these chunks take at most half the budget: a long prompt shares its steps with
     new arrivals instead of holding them until its last chunk;
  3. admission: waiting sequences in policy order take a row, their cached prefix (locked)
     and a first chunk, while budget, rows and pages last. A page of headroom per running
     sequence is kept back so that new arrivals do not force retractions at once. A sequence
     whose first page is being computed right now by another one (same tokens, not cached
     yet) waits a step or two and then reuses it instead of computing it again. With lpm
     the queue is re-ranked by cached prefix first (`policy.py`).
Before all that, with the priority policy, a waiting sequence that has no place or memory
takes those of running sequences of lower priority: they are retracted (`_preempt`).
Pages and page-table slots are written here, before the batch is sent. The planner works on
the parts it is given (rows, KV pool, waiting queue, running set) and returns a `StepPlan`;
the scheduler builds the batch from it and keeps the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tessera.scheduler_proc import speculation
from tessera.scheduler_proc.batch import Chunk
from tessera.scheduler_proc.config import SchedulerConfig
from tessera.scheduler_proc.kv_pool import KVPool
from tessera.scheduler_proc.policy import WaitingQueue, preemption_victim
from tessera.scheduler_proc.request import Sequence
from tessera.scheduler_proc.running import RunningSet
from tessera.scheduler_proc.speculation import Drafts, Speculation
from tessera.scheduler_proc.step_cost import StepCost


def longest_first(rows: np.ndarray, kv_len: np.ndarray) -> np.ndarray:
    """A step's decode rows, the longest context first (ties in their given order). The
    decode attention kernels hand out a request's programs in the batch's order, each taking
    time in proportion to its context: longest first, the short ones fill in at the end (list
    scheduling's longest-processing-time rule) instead of one long request running alone at
    the end of the kernel. No row's result depends on its place in the batch."""
    if rows.shape[0] < 2:
        return rows
    return rows[np.argsort(-kv_len[rows].astype(np.int64), kind="stable")]


def fill_padding(decode_tokens: int, budget: int, sizes: tuple[int, ...], cap: int) -> int:
    """The prefill budget grown into the padding of the step it would make: a step of
    decode_tokens + budget tokens runs as the smallest of `sizes` that holds it (a captured
    graph), so up to that size prompt tokens take the padding's place, at most `cap` of them.
    A step beyond every size (eager) or none given: the budget as it is."""
    total = decode_tokens + budget
    for size in sizes:  # ascending
        if size >= total:
            return max(budget, min(cap, size - decode_tokens))
    return budget


@dataclass
class StepPlan:
    """One step's work, its pages already allocated and its slots written."""

    decode_rows: np.ndarray
    decode_inputs: np.ndarray  # -1: the token this row sampled last (still in flight)
    chunks: list[Chunk] = field(default_factory=list)
    drafts: Drafts | None = None  # the decodes' proposals (1 + lens input ids each)
    draft_lens: np.ndarray | None = None  # per decode row: proposals it verifies
    retracted: int = 0  # running sequences that gave their pages to the decodes
    cache_query_tokens: int = 0  # prompt tokens of the admitted sequences
    cache_hit_tokens: int = 0  # of which served from the cache

    @property
    def empty(self) -> bool:
        return not self.decode_rows.shape[0] and not self.chunks


class Planner:
    MAX_DEFERRED = 32  # sequences looked past per step while their prefix is in the making

    def __init__(self, config: SchedulerConfig, kv: KVPool, waiting: WaitingQueue,
                 running: RunningSet, step_cost: StepCost,
                 spec: Speculation | None = None) -> None:
        self.config = config
        self.page_size = config.page_size
        self.kv, self.waiting, self.running = kv, waiting, running
        self.st = running.st
        self.step_cost = step_cost  # measured by the scheduler from the worker's step times
        self.spec = spec

    def _first_page(self, seq: Sequence) -> bytes | None:
        ps = self.page_size
        if not self.kv.use_cache or seq.tokens.shape[0] <= ps:
            return None  # nothing another request could match
        return seq.tokens[:ps].tobytes()

    def backlog(self) -> int:
        """Prompt tokens awaiting their prefill: the waiting sequences' tokens (before any
        cached prefix) and what the admitted ones still prefilling have left."""
        st = self.st
        rows = self.running.active_rows()
        left = 0
        if rows.shape[0]:
            rest = st.n_known[rows].astype(np.int64) - st.kv_len[rows]
            left = int(rest[rest > 1].sum())  # a decoding row has at most its one token left
        return self.waiting.tokens + left

    def token_budget(self, decodes: int, awaiting: int = 0, backlog: int = 0,
                     decode_tokens: int | None = None) -> int:
        """Prefill tokens this step may compute (`step_cost.py`): --chunked-prefill-size;
        while `decodes` streams decode, what keeps the step within --max-mixed-step-ratio
        decode steps (at least an eighth of the chunk size, so arrivals are not starved);
        about --step-target-ms of work at the measured speed (whoever arrives meanwhile waits
        for this step).

        The decodes are protected while the `awaiting` requests (waiting, or admitted and
        still prefilling: none has its first token yet) do not outnumber them. When more
        await than stream (a burst of arrivals, an offline batch), a step may take half the
        chunk whatever the ratio says: holding many prompts back to spare few streams a
        longer step loses on both counts. An H200's B2 (256 prompts at once) prefilled 256
        tokens a step beside its first few decodes and took 1507 steps where whole chunks
        take 1076. Half, not the whole chunk: B3's c=128 tier (128 prompts at its start, a
        queue after) then had steps of 2048 tokens beside dozens of streams, and its ITL p99
        went from 28.3 to 36.3 ms.

        A `backlog` of prompt tokens (awaiting their prefill) that the protected budget would
        take more than --prefill-backlog-steps steps to serve raises it to what serves them in
        about that many, a step taking at most --max-backlog-step-ratio decode steps (off by
        default). Under a steady stream of arrivals the protected budget leaves a backlog
        that it serves only as fast as new prompts arrive: B3's c=128 tier waited about half a
        second for a first token. The rule shortens that wait (an H200 at 16: TTFT p50 317-352
        against 473-497 ms) but its longer steps cost more than the streams it adds decode
        (6773-6786 against 6880-6904 tok/s; docs/performance.md), so it is a choice, not the
        default.

        Last, with --fill-padded-steps, a budget whose step the worker would run padded to a
        larger size (`step_token_sizes`, its captured graphs) grows into the padding: those
        tokens cost the device the same either way. `decode_tokens`: the decodes' tokens
        (more than `decodes` where they verify proposals)."""
        c = self.config
        cap = c.chunked_prefill_size or (1 << 30)
        def budget_at(ratio: float) -> int:
            return self.step_cost.prefill_budget(
                decodes=decodes, cap=cap, min_tokens=max(self.page_size, cap // 8),
                floor=self.page_size, max_mixed_step_ratio=ratio,
                step_target_ms=c.step_target_ms)

        budget = budget_at(c.max_mixed_step_ratio)
        if 0 < decodes < awaiting:  # unprotected (ratio 0), up to half the chunk
            budget = max(budget, min(budget_at(0.0), max(1, cap // 2)))
        steps = c.prefill_backlog_steps
        if steps and backlog > steps * budget:  # (a budget at the cap stays there)
            wanted = -(-backlog // steps)
            budget = max(budget, min(wanted, budget_at(c.max_backlog_step_ratio)))
        if c.fill_padded_steps and budget > 0:
            budget = fill_padding(decodes if decode_tokens is None else decode_tokens,
                                  budget, c.step_token_sizes, cap)
        return budget

    def plan(self, step: int) -> StepPlan:
        """The work of step number `step`."""
        preempted = self._preempt() if self.running.by_priority else 0
        rows, inputs, retracted, drafts = self._plan_decodes(step)
        plan = StepPlan(rows, inputs, retracted=preempted + retracted, drafts=drafts)
        if drafts is not None:
            plan.draft_lens = self._lens_of(rows, drafts)
        decodes = int(rows.shape[0])
        awaiting = len(self.waiting) + max(0, len(self.running) - decodes)
        backlog = self.backlog() if decodes and self.config.prefill_backlog_steps else 0
        decode_tokens = decodes + (int(plan.draft_lens.sum()) if plan.draft_lens is not None
                                   else 0)
        budget = self.token_budget(decodes, awaiting, backlog, decode_tokens)
        # Half (a token at least, so they always move), not a page at least: a budget of one
        # page went wholly to the running prefill and the waiting requests never got in.
        share = max(1, budget // 2) if self.waiting else budget
        plan.chunks, left = self._plan_prefills(min(share, budget))
        self._admit(plan, left + budget - min(share, budget))
        return plan

    def _preempt(self) -> int:
        """Priority policy: while the first waiting sequence has no row or no memory for its
        first chunk, retract running sequences of lower priority (lowest first). Done before
        the decodes are planned, so a retracted sequence is in no part of this step. Returns
        how many were retracted."""
        running, retracted = self.running, 0
        while (head := self.waiting.peek()) is not None:
            victim = preemption_victim(head, running.seqs.values())
            if victim is None or self._fits(head):
                break
            running.retract(victim)
            retracted += 1
        return retracted

    def _fits(self, seq: Sequence) -> bool:
        """Would admission take `seq`: a place among the running sequences, and pages for
        its first chunk beyond the headroom kept for them? (A row a retracted sequence left
        comes free once the steps in flight are back: it counts as free. A sequence waiting
        for a first page that another one is computing gains nothing from memory: it fits.)"""
        running, ps = self.running, self.page_size
        if len(running) >= self.config.max_running_requests:
            return False
        cached = self.kv.matched_tokens(seq.tokens)
        key = self._first_page(seq)
        if not cached and key is not None and key in running.prefixes:
            return True
        budget = self.token_budget(len(running))
        chunk = min(int(seq.tokens.shape[0]) - cached, max(ps, budget // 2))
        need = -(-chunk // ps)
        return self.kv.available() - len(running) >= need

    def _decode_ready(self) -> np.ndarray:
        st = self.st
        rows = self.running.active_rows()
        if not rows.shape[0]:
            return rows
        total = st.n_known[rows] + st.pending[rows]
        decoding = st.kv_len[rows] == total - 1  # the prompt is in KV (token in flight or not)
        ready = decoding & (total < st.max_total[rows])
        depth = self.config.steps_in_flight
        if not self.config.chained:
            # Batches in flight are independent: a row waits for its token to come back, and
            # each batch takes its share of the decoding rows, so every stage has work.
            ready &= st.pending[rows] == 0
            chosen = rows[ready]
            share = -(-int(decoding.sum()) // depth)
            return chosen[:share]
        if depth > 1:
            # Penalties need the full history; the token in flight is not known yet.
            ready &= ~(st.has_penalty[rows] & (st.pending[rows] > 0))
        return rows[ready]

    def _plan_decodes(self, step: int
                      ) -> tuple[np.ndarray, np.ndarray, int, Drafts | None]:
        """(decode rows, their input ids, sequences retracted to make room, proposals)."""
        st, ps, running = self.st, self.page_size, self.running
        retracted = 0
        while True:
            rows = self._decode_ready()
            drafts = chained = None
            if self.spec is not None:
                if rows.shape[0]:
                    rows, drafts = self.spec.plan(rows, step)
                if self.config.chained:
                    chained = self.spec.chain(running.active_rows(), step)
                if chained is not None:
                    rows = np.concatenate([rows, chained.rows])
                    drafts = speculation.merge(drafts, chained)
            grow = rows[st.kv_len[rows] % ps == 0]  # the new token starts a page
            available = self.kv.available()
            if drafts is not None:
                extra = int(speculation.extra_pages(st, drafts.rows, drafts.lens + 1).sum()
                            - (st.kv_len[drafts.rows] % ps == 0).sum())
                if grow.shape[0] + extra <= available:
                    break
                drafts = None  # proposals wait for memory before anyone is retracted
                if chained is not None:  # a chained row has nothing to run without them
                    rows = rows[:rows.shape[0] - chained.count]
                    grow = rows[st.kv_len[rows] % ps == 0]
                    chained = None
            if grow.shape[0] <= available:
                break
            if len(running) <= 1:  # cannot happen after admission checks; stay safe
                rows = rows[st.kv_len[rows] % ps != 0]
                grow = rows[:0]
                break
            running.retract(running.victim())
            retracted += 1
        if drafts is not None:
            if chained is not None and self.spec is not None:
                self.spec.stats.chained_steps += chained.count
            return rows, self._write_verifies(rows, drafts), retracted, drafts
        if grow.shape[0]:
            st.pages[grow, st.n_pages[grow]] = self.kv.alloc(int(grow.shape[0]))
            st.n_pages[grow] += 1
        if self.config.decode_order == "longest-first":
            rows = longest_first(rows, st.kv_len)
        pos = st.kv_len[rows]
        st.req_to_token[rows, pos] = st.pages[rows, pos // ps] * ps + pos % ps
        pending = st.pending[rows]
        last = st.n_known[rows] + pending - 1
        # pending > 0: the last token is still in flight; -1 asks the worker for it.
        inputs = np.where(pending > 0, -1, st.tokens[rows, np.minimum(last, st.width - 1)])
        st.kv_len[rows] = pos + 1
        st.pending[rows] = pending + 1
        return rows, inputs.astype(np.int32), retracted, None

    def _lens_of(self, rows: np.ndarray, drafts: Drafts) -> np.ndarray:
        """Proposals of each of `rows` (0 for a plain decode)."""
        per_row = np.zeros(self.st.uid.shape[0], dtype=np.int32)
        per_row[drafts.rows] = drafts.lens
        return per_row[rows]

    def _write_verifies(self, rows: np.ndarray, drafts: Drafts) -> np.ndarray:
        """Pages, slots and input ids of a decode step some of whose rows verify proposals
        (1 + lens tokens each; the others 1): the flat input ids. The proposals are also
        written after the row's tokens (RowState.tokens past n_known), where a chained
        proposal looks them up; the result overwrites them with what was sampled."""
        st, ps = self.st, self.page_size
        lens = self._lens_of(rows, drafts)
        extend = lens + 1
        need = speculation.extra_pages(st, rows, extend)
        total = int(need.sum())
        if total:
            owner = np.repeat(rows, need)
            within = np.arange(total) - np.repeat(np.cumsum(need) - need, need)
            st.pages[owner, st.n_pages[owner] + within] = self.kv.alloc(total)
            st.n_pages[rows] += need
        n_tok = int(extend.sum())
        tok_rows = np.repeat(rows, extend)
        starts = np.cumsum(extend) - extend
        within = np.arange(n_tok) - np.repeat(starts, extend)
        pos = np.repeat(st.kv_len[rows], extend) + within
        st.req_to_token[tok_rows, pos] = st.pages[tok_rows, pos // ps] * ps + pos % ps
        pending = st.pending[rows]
        last = st.n_known[rows] + pending - 1
        inputs = np.empty(n_tok, dtype=np.int32)
        # pending > 0: a plain decode's token in flight, or a chained verify's input (the
        # token its row's verify in flight samples last); -1 asks the worker for it.
        inputs[starts] = np.where(pending > 0, -1, st.tokens[rows, np.minimum(last,
                                                                               st.width - 1)])
        proposed = within > 0
        inputs[proposed] = drafts.tokens[self._draft_order(rows, drafts, lens)]
        st.tokens[tok_rows[proposed], pos[proposed]] = inputs[proposed]
        st.kv_len[rows] += extend
        st.pending[rows] = pending + 1
        st.drafts[rows] += lens
        return inputs

    @staticmethod
    def _draft_order(rows: np.ndarray, drafts: Drafts, lens: np.ndarray) -> np.ndarray:
        """Indices into drafts.tokens in the order of `rows` (drafts.rows is a subset of
        rows, maybe in another order)."""
        where = np.cumsum(drafts.lens) - drafts.lens
        start_of = np.zeros(int(rows.max()) + 1, dtype=np.int64)
        start_of[drafts.rows] = where
        spec_rows = rows[lens > 0]
        spec_lens = lens[lens > 0]
        base = np.repeat(start_of[spec_rows], spec_lens)
        within = np.arange(int(spec_lens.sum())) - np.repeat(np.cumsum(spec_lens) - spec_lens,
                                                             spec_lens)
        return base + within

    def _chunk(self, seq: Sequence, budget: int, reserve: int) -> Chunk | None:
        """Allocate and write the next prefill chunk of a bound sequence, as long as the
        pages allow (None if not even one token fits)."""
        st, row = self.st, seq.row
        start = int(st.kv_len[row])
        extend = min(int(st.n_known[row]) - start, budget)
        room = self.kv.available() - reserve
        extend = min(extend, (int(st.n_pages[row]) + room) * self.page_size - start)
        if extend <= 0:
            return None
        need = st.pages_needed(row, extend)
        if need > 0:
            st.add_pages(row, self.kv.alloc(need))
        st.write_slots(row, start, start + extend)
        st.kv_len[row] = start + extend
        # max_tokens 0 (a scored prompt): the prompt is all there is, nothing is sampled.
        sample = start + extend == int(st.n_known[row]) and \
            int(st.n_known[row]) < int(st.max_total[row])
        if sample:
            st.pending[row] += 1
        return Chunk(row, start, extend, sample)

    def _plan_prefills(self, budget: int) -> tuple[list[Chunk], int]:
        """Next chunks of sequences admitted earlier whose prompt is not all in KV yet."""
        st, running = self.st, self.running
        rows = running.active_rows()
        chunks: list[Chunk] = []
        if not rows.shape[0]:
            return chunks, budget
        known, kv = st.n_known[rows], st.kv_len[rows]
        # A prompt's last token is usually computed as the first decode (it samples); a
        # prefill-only request (max_tokens 0: scored or embedded) prefills it instead.
        prefill_only = st.max_total[rows] <= known
        prefilling = rows[(kv < known + st.pending[rows] - 1) | (prefill_only & (kv < known))]
        seqs = [running.seqs[r] for r in prefilling.tolist()]

        def order(q: Sequence) -> tuple[int, bool, int, int]:
            # Within a priority, prompts whose rest fits this step first: a short request
            # admitted beside a long prompt finishes its prefill now instead of waiting for
            # every chunk of the older prompt (each such prompt ends here: no starvation).
            first, order, index = q.sort_key(running.by_priority)
            fits = int(st.n_known[q.row]) - int(st.kv_len[q.row]) <= budget
            return first, not fits, order, index

        seqs.sort(key=order)
        for seq in seqs:
            if budget <= 0:
                break
            chunk = self._chunk(seq, budget, reserve=0)
            if chunk is None:
                break
            chunks.append(chunk)
            budget -= chunk.extend
        return chunks, budget

    def _admit(self, plan: StepPlan, budget: int) -> None:
        """Bind waiting sequences to rows while budget, rows and pages last."""
        kv, waiting, running = self.kv, self.waiting, self.running
        limit = self.config.max_running_requests
        deferred: list[Sequence] = []
        if budget > 0 and running.row_pool.free_rows and len(running) < limit:
            waiting.rank(kv.matched_tokens, kv.cache_version)
        while budget > 0 and running.row_pool.free_rows and len(running) < limit:
            seq = waiting.peek()
            if seq is None:
                break
            sp = seq.req.sampling
            scores = seq.index == 0 and (sp.prompt_logprobs is not None or sp.embed == "mean")
            # A request scoring its prompt (or averaging its hidden states) needs every prompt
            # position computed: no cached prefix (its KV may still go to the cache).
            prefix, node = kv.match(seq.tokens[:1] if scores else seq.tokens)
            key = self._first_page(seq) if not prefix.shape[0] and not scores else None
            if key is not None and key in running.prefixes:
                kv.unlock(node)  # its prefix is being computed: reuse it when cached
                deferred.append(waiting.pop())
                if len(deferred) >= self.MAX_DEFERRED:
                    break
                continue
            reserve = len(running)  # a page of headroom per running sequence
            if kv.available() <= reserve:
                kv.unlock(node)
                break
            waiting.pop()
            running.bind(seq, prefix, node)
            chunk = self._chunk(seq, budget, reserve)
            if chunk is None:  # not even one page: undo
                running.unbind(seq, insert=False)
                waiting.push(seq)
                break
            if key is not None:
                running.prefixes.add(seq, key)
            plan.chunks.append(chunk)
            budget -= chunk.extend
            plan.cache_query_tokens += int(seq.tokens.shape[0])
            plan.cache_hit_tokens += int(prefix.shape[0]) * self.page_size
        for seq in deferred:
            waiting.push(seq)  # same place in line: the sort key did not change
