"""Choose one step's work: which sequences run, how many tokens each, with which pages.

In order, every step:
  1. decodes: every running sequence whose prompt is in KV takes one token. When their new
     pages do not fit (after evicting unlocked cache pages), the youngest running sequence
     is retracted (`policy.retraction_victim`) until they do: decodes never deadlock;
  2. prefill chunks of sequences admitted earlier, under the token budget
     (`Planner.token_budget`: chunked_prefill_size, cut to about step_target_ms of
     work when others decode or wait; decodes do not count against it). While requests
     wait, these chunks take at most half the budget: a long prompt shares its steps with
     new arrivals instead of holding them until its last chunk;
  3. admission: waiting sequences in policy order take a row, their cached prefix (locked)
     and a first chunk, while budget, rows and pages last. A page of headroom per running
     sequence is kept back so that new arrivals do not force retractions at once. A sequence
     whose first page is being computed right now by another one (same tokens, not cached
     yet) waits a step or two and then reuses it instead of computing it again.
Pages and page-table slots are written here, before the batch is sent. The planner works on
the parts it is given (rows, KV pool, waiting queue, running set) and returns a `StepPlan`;
the scheduler builds the batch from it and keeps the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tessera.scheduler_proc.batch import Chunk
from tessera.scheduler_proc.config import SchedulerConfig
from tessera.scheduler_proc.kv_pool import KVPool
from tessera.scheduler_proc.policy import WaitingQueue
from tessera.scheduler_proc.request import Sequence
from tessera.scheduler_proc.running import RunningSet


@dataclass
class StepPlan:
    """One step's work, its pages already allocated and its slots written."""

    decode_rows: np.ndarray
    decode_inputs: np.ndarray  # -1: the token this row sampled last (still in flight)
    chunks: list[Chunk] = field(default_factory=list)
    retracted: int = 0  # running sequences that gave their pages to the decodes
    cache_query_tokens: int = 0  # prompt tokens of the admitted sequences
    cache_hit_tokens: int = 0  # of which served from the cache

    @property
    def empty(self) -> bool:
        return not self.decode_rows.shape[0] and not self.chunks


class Planner:
    MAX_DEFERRED = 32  # sequences looked past per step while their prefix is in the making

    def __init__(self, config: SchedulerConfig, kv: KVPool, waiting: WaitingQueue,
                 running: RunningSet) -> None:
        self.config = config
        self.page_size = config.page_size
        self.kv, self.waiting, self.running = kv, waiting, running
        self.st = running.st

    def _first_page(self, seq: Sequence) -> bytes | None:
        ps = self.page_size
        if not self.kv.use_cache or seq.tokens.shape[0] <= ps:
            return None  # nothing another request could match
        return seq.tokens[:ps].tobytes()

    def token_budget(self, ms_per_token: float) -> int:
        """Prefill tokens this step may compute: --chunked-prefill-size, cut to about
        step_target_ms of work at the measured speed (`ms_per_token`, 0: unknown) when other
        requests would wait for the step (some decode or wait); never below a page."""
        budget = self.config.chunked_prefill_size or (1 << 30)
        target = self.config.step_target_ms
        if target > 0 and ms_per_token > 0 and (len(self.running) > 1 or self.waiting):
            budget = min(budget, max(self.page_size, int(target / ms_per_token)))
        return budget

    def plan(self, ms_per_token: float = 0.0) -> StepPlan:
        """The next step, at the device's measured cost of a prefill token."""
        rows, inputs, retracted = self._plan_decodes()
        plan = StepPlan(rows, inputs, retracted=retracted)
        budget = self.token_budget(ms_per_token)
        share = max(self.page_size, budget // 2) if self.waiting else budget
        plan.chunks, left = self._plan_prefills(min(share, budget))
        self._admit(plan, left + budget - min(share, budget))
        return plan

    def _decode_ready(self) -> np.ndarray:
        st = self.st
        rows = self.running.active_rows()
        if not rows.shape[0]:
            return rows
        total = st.n_known[rows] + st.pending[rows]
        ready = (st.kv_len[rows] == total - 1) & (total < st.max_total[rows])
        if self.config.overlap:
            # Penalties need the full history; the token in flight is not known yet.
            ready &= ~(st.has_penalty[rows] & (st.pending[rows] > 0))
        return rows[ready]

    def _plan_decodes(self) -> tuple[np.ndarray, np.ndarray, int]:
        """(decode rows, their input ids, sequences retracted to make room)."""
        st, ps, running = self.st, self.page_size, self.running
        retracted = 0
        while True:
            rows = self._decode_ready()
            grow = rows[st.kv_len[rows] % ps == 0]  # the new token starts a page
            if grow.shape[0] <= self.kv.available():
                break
            if len(running) <= 1:  # cannot happen after admission checks; stay safe
                rows = rows[st.kv_len[rows] % ps != 0]
                grow = rows[:0]
                break
            running.retract(running.victim())
            retracted += 1
        if grow.shape[0]:
            st.pages[grow, st.n_pages[grow]] = self.kv.alloc(int(grow.shape[0]))
            st.n_pages[grow] += 1
        pos = st.kv_len[rows]
        st.req_to_token[rows, pos] = st.pages[rows, pos // ps] * ps + pos % ps
        pending = st.pending[rows]
        last = st.n_known[rows] + pending - 1
        # pending > 0: the last token is still in flight; -1 asks the worker for it.
        inputs = np.where(pending > 0, -1, st.tokens[rows, np.minimum(last, st.width - 1)])
        st.kv_len[rows] = pos + 1
        st.pending[rows] = pending + 1
        return rows, inputs.astype(np.int32), retracted

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
        prefilling = rows[st.kv_len[rows] < st.n_known[rows] + st.pending[rows] - 1]
        seqs = [running.seqs[r] for r in prefilling.tolist()]
        seqs.sort(key=lambda q: q.sort_key(running.by_priority))
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
        while budget > 0 and running.row_pool.free_rows and len(running) < limit:
            seq = waiting.peek()
            if seq is None:
                break
            scores = seq.index == 0 and seq.req.sampling.prompt_logprobs is not None
            # A request scoring its prompt needs the logits of every prompt position: no
            # cached prefix (its KV may still go to the cache for others).
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
