"""The scheduler core: continuous batching over a paged KV pool with a radix prefix cache.

No sockets here (process.py does the I/O), so tests and the benchmark drive it directly:

    sched.add_request(TokenizedRequest) -> ErrorReply | None   (refused at admission)
    sched.take_grammar_inits() / on_grammar_ready(GrammarReady) (requests with a grammar)
    sched.abort(rid, reason)                                    (frees everything at once)
    sched.next_batch() -> ForwardBatch | None                   (plan, allocate, write slots)
    sched.on_result(SampledTokens) -> TokenBatch | None         (apply, finish, cache)
    sched.take_output() / take_errors()                         (aborts, failures)

Each step: decodes of every running sequence (retracting the youngest when pages run out),
then the prefill chunks of sequences already admitted, then new sequences, under the token
budget `chunked_prefill_size`. With `overlap`, step n+1 is built and sent before step n's
result is read: decodes use input id -1 ("what this row sampled last"), and a finish is seen
one step late (the extra token is dropped). When the workers hold several batches in flight
(`batches_in_flight`, one per pipeline stage), a row decodes again only once its last token is
back, and the decoding rows are spread over the batches in flight, so the stages all work.

Page invariant (`check_invariant`): every usable page is exactly one of free, held by a
running sequence (its own pages, or a cache page on a path it locks), or held only by the
cache. Rows and pages of sequences that start and stop: `running.py`; what one step runs:
`planner.py`. A request with a grammar waits outside the queue until worker rank 0 has
compiled it (the GrammarInit / GrammarReady exchange), so a slow compile never holds up a
step; the matcher ids of sequences that end ride on the next ForwardBatch (`grammar_free`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from tessera.bus.messages import (
    AbortRequest,
    ErrorReply,
    ForwardBatch,
    GrammarInit,
    GrammarReady,
    SampledTokens,
    TokenBatch,
    TokenizedRequest,
)
from tessera.scheduler_proc import batch as batch_mod
from tessera.scheduler_proc import finish
from tessera.scheduler_proc.admission import Limits, make_request, refuse
from tessera.scheduler_proc.batch import InFlight
from tessera.scheduler_proc.config import SchedulerConfig
from tessera.scheduler_proc.invariant import check
from tessera.scheduler_proc.kv_pool import KVPool
from tessera.scheduler_proc.output import OutputBuilder
from tessera.scheduler_proc.planner import Planner, StepPlan
from tessera.scheduler_proc.policy import WaitingQueue
from tessera.scheduler_proc.request import Request, SeqState, Sequence
from tessera.scheduler_proc.rows import RowState
from tessera.scheduler_proc.running import RunningSet
from tessera.scheduler_proc.speculation import Speculation, make_proposer, rollback
from tessera.scheduler_proc.step_cost import StepCost

# A record's uid for a row it no longer answers for: no sequence has it, a free row (-1)
# neither, so the row's result is ignored when that step comes back.
FORGOTTEN_UID = -2

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, config: SchedulerConfig, req_to_token: np.ndarray | None = None) -> None:
        c = self.config = config
        self.page_size = ps = c.page_size
        n_rows, width = c.max_running_requests, c.max_context_len
        if req_to_token is None:
            req_to_token = np.zeros((n_rows, width), dtype=np.int32)
        self.st = RowState(n_rows, width, ps, req_to_token)
        self.kv = KVPool(c.num_slots, ps, self.st, not c.disable_radix_cache,
                         debug=c.debug_invariants)
        self.allocator = self.kv.allocator
        self.cache = self.kv.cache
        by_priority = c.schedule_policy == "priority"
        self.waiting = WaitingQueue(by_priority, by_prefix=c.schedule_policy == "lpm")
        self.running = RunningSet(self.st, self.kv, self.waiting, by_priority)
        self.step_cost = StepCost()  # decode step and prefill token, measured
        proposer = make_proposer(c, self.st)
        self.spec = Speculation(proposer, self.st) if proposer is not None else None
        self.planner = Planner(c, self.kv, self.waiting, self.running, self.step_cost,
                               self.spec)
        self.limits = Limits(c, self.allocator.total_pages)
        self.requests: dict[str, Request] = {}
        self.inflight: deque[InFlight] = deque()
        self.depth = c.steps_in_flight
        self._out = OutputBuilder()
        self._errors: list[ErrorReply] = []
        self._step = 0
        self._order = 0
        self._next_grammar_id = 0
        self._grammar_inits: list[GrammarInit] = []
        self._grammar_waiting: dict[int, Request] = {}  # first matcher id -> request
        self._grammar_free: list[int] = []
        # metrics
        self.retracted_total = 0
        self.cache_hit_tokens = 0
        self.cache_query_tokens = 0
        self.finished_total = 0
        self.aborted_total = 0
        self.steps_done = 0
        self.cpu_ms_ema = 0.0
        self.decode_tokens_total = 0  # tokens of the steps answered, by kind
        self.prefill_tokens_total = 0

    # ---------------------------------------------------------------------------- requests
    def add_request(self, req: TokenizedRequest) -> ErrorReply | None:
        if req.resent and req.rid in self.requests:
            return None  # the first copy got through before its tokenizer died
        ids = np.array(req.input_ids, dtype=np.int32).reshape(-1)
        problem = self.limits.check(req, ids, len(self.waiting), req.rid in self.requests)
        if problem is not None:
            return refuse(req, *problem)
        request = make_request(req, ids, self._order,
                               self.limits.max_total(ids.shape[0], req.sampling.max_tokens),
                               self.config.eos_token_ids)
        self._order += 1
        request.queued_at = time.monotonic()
        self.requests[req.rid] = request
        grammar = req.sampling.grammar
        if grammar is None:
            self.waiting.push(request.seqs[0])
            return None
        first = self._next_grammar_id
        self._next_grammar_id += len(request.seqs)
        for seq in request.seqs:
            seq.grammar_id = first + seq.index
        self._grammar_waiting[first] = request
        self._grammar_inits.append(GrammarInit(first_id=first, count=len(request.seqs),
                                               grammar=grammar))
        return None

    def take_grammar_inits(self) -> list[GrammarInit]:
        """GrammarInit messages for worker rank 0 (requests admitted since the last call)."""
        inits, self._grammar_inits = self._grammar_inits, []
        return inits

    def on_grammar_ready(self, msg: GrammarReady, error_status: int = 400) -> None:
        """A grammar is compiled (the request may run now) or refused (the request fails with
        `error_status`: 400 for a grammar the engine cannot use)."""
        req = self._grammar_waiting.pop(msg.first_id, None)
        if req is None or self.requests.get(req.rid) is not req:
            # Aborted while compiling: the worker made matchers nobody will use.
            count = len(req.seqs) if req is not None else 1
            self._grammar_free.extend(range(msg.first_id, msg.first_id + count))
            return
        if msg.error is not None:
            grammar = req.sampling.grammar
            self._fail_request(req, error_status, msg.error,
                               error_type="invalid_request_error" if error_status < 500
                               else "server_error",
                               param=grammar.param if grammar is not None else None)
            return
        self.waiting.push(req.seqs[0])

    @property
    def grammars_compiling(self) -> int:
        return len(self._grammar_waiting)

    def abort(self, rid: str, reason: str = "abort", index: int | None = None) -> bool:
        """Stop every sample of `rid` (or only sample `index`) now; the detokenizer hears a
        final "abort" (or "stop" when the detokenizer itself matched a stop string)."""
        req = self.requests.get(rid)
        if req is None:
            return False
        if reason == AbortRequest.LOST_ROUTE:
            self._fail_request(req, 503, "the detokenizer restarted and lost this request's "
                                         "output; retry it")
            self.aborted_total += 1
            return True
        finish = "stop" if reason == "stop" else "abort"
        if index is None:
            req.fork_pending = []
            chosen = req.seqs
        else:
            chosen = [s for s in req.seqs if s.index == index]
            req.fork_pending = [s for s in req.fork_pending if s.index != index]
            if index == 0 and req.fork_pending:
                for sib in req.fork_pending:  # they waited for its prompt: compute it alone
                    self.waiting.push(sib)
                req.fork_pending = []
        for seq in chosen:
            if seq.state is SeqState.FINISHED:
                continue
            self._drop(seq)
            self._out.add_finish(req, seq.index, finish, seq.cached_tokens)
        self.aborted_total += 1
        return True

    def expire_waiting(self, timeout_s: float, now: float | None = None) -> int:
        """Fail (503) requests that waited `timeout_s` without ever running."""
        now = time.monotonic() if now is None else now
        stale = [s.req for s in self.waiting.sequences()
                 if s.index == 0 and s.cached_tokens < 0 and now - s.req.queued_at > timeout_s]
        for req in stale:
            self._fail_request(req, 503, f"the request waited {now - req.queued_at:.0f} s "
                               f"without being scheduled (request_timeout_s={timeout_s:g}); the "
                               f"server is overloaded, retry later")
        return len(stale)

    def flush_cache(self) -> int:
        """Drop every unreferenced cached page; return how many."""
        return self.kv.flush()

    def take_output(self) -> TokenBatch | None:
        return self._out.take()

    def take_errors(self) -> list[ErrorReply]:
        errors, self._errors = self._errors, []
        return errors

    def has_work(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    # ---------------------------------------------------------------------------- planning
    def next_batch(self) -> ForwardBatch | None:
        """Plan the next step, allocate its pages, write its slots; None if nothing to run."""
        if len(self.inflight) >= self.depth:
            return None
        t0 = time.thread_time()
        while True:
            plan = self.planner.plan(self._step)
            self._count(plan)
            if not plan.empty:
                break
            if self.inflight or not self.running:
                return None
            # Nothing fits and nothing will come back to free memory: give way.
            self.running.retract(self.running.victim())
            self.retracted_total += 1
        step = self._step
        self._step += 1
        free = None
        if self._grammar_free:
            free = np.array(self._grammar_free, dtype=np.int64)
            self._grammar_free = []
        batch, record = batch_mod.build(step, self.st, plan.decode_rows, plan.decode_inputs,
                                        plan.chunks, self.running.seq_of_row, free,
                                        dec_drafts=plan.draft_lens)
        self.st.last_step[batch.rows] = step
        record.build_cpu_s = time.thread_time() - t0
        self.inflight.append(record)
        return batch

    def _count(self, plan: StepPlan) -> None:
        self.retracted_total += plan.retracted
        self.cache_query_tokens += plan.cache_query_tokens
        self.cache_hit_tokens += plan.cache_hit_tokens

    # ---------------------------------------------------------------------------- leaving
    def _drop(self, seq: Sequence) -> None:
        """Forget a sequence wherever it is (abort, failure)."""
        if seq.state is SeqState.RUNNING:
            self.running.unbind(seq, insert=True)
        elif seq.state is SeqState.WAITING:
            self.waiting.discard(seq)
        self._finished(seq)

    def _finished(self, seq: Sequence) -> None:
        if seq.grammar_id >= 0:
            self._grammar_free.append(seq.grammar_id)
        seq.state = SeqState.FINISHED
        req = seq.req
        req.live -= 1
        if req.live <= 0:
            self.requests.pop(req.rid, None)

    def _fail_request(self, req: Request, status: int, message: str,
                      error_type: str = "server_error", param: str | None = None) -> None:
        req.fork_pending = []
        for seq in req.seqs:
            if seq.state is not SeqState.FINISHED:
                self._drop(seq)
        self._errors.append(ErrorReply(rid=req.rid, status=status, message=message,
                                       error_type=error_type, param=param,
                                       reply_to=req.detok.reply_to))

    # ---------------------------------------------------------------------------- results
    def on_result(self, res: SampledTokens,
                  early: Callable[[TokenBatch], None] | None = None) -> TokenBatch | None:
        """Apply one step's sampled tokens; return what the detokenizer must hear.

        `early`: where the output goes at once when it carries a request's first token and
        another step is still in flight, before the prompt's pages enter the prefix cache
        (then None is returned): a time to first token does not wait for that bookkeeping.
        """
        lost = []
        while self.inflight and self.inflight[0].step < res.step:
            lost.append(self.inflight.popleft())  # the worker ran them; their answers are lost
        if lost:
            log.error("no result came for step(s) %s: failing their requests",
                      [r.step for r in lost])
            self._fail_records(lost, 503, "the model worker's result was lost; retry")
        if not self.inflight or res.step != self.inflight[0].step:
            log.warning("dropping a result for step %d (expected %s)", res.step,
                        self.inflight[0].step if self.inflight else "none")
            if self.running.completed_step < res.step < self._step:
                # A late answer to a step failed by fail_inflight: the worker is done with
                # it (it runs steps in order), so the rows it named may be reused now.
                self.running.step_completed(res.step)
            return None
        t0 = time.thread_time()
        early_sent, held = False, None
        rec = self.inflight.popleft()
        self.running.completed_step = rec.step
        st = self.st
        same = st.uid[rec.rows] == rec.uids
        st.kv_done[rec.rows[same]] = rec.seq_lens[same]
        problem = res.error or _shape_problem(rec, res)
        if problem is not None:
            self._fail_records([rec], 500, f"the model step failed: {problem}")
        else:
            if rec.scored:
                self._apply_prompt_logprobs(rec, res)
            if rec.embedded:
                self._apply_embeddings(rec, res)
            self._apply_tokens(rec, res)
            self._finish_prefill_only(rec)
            if early is not None and self.inflight and rec.prefill_rows.shape[0]:
                held = self._out.take()
                if held is not None and held.new_requests:
                    early(held)
                    early_sent, held = True, None
            if self.kv.use_cache and rec.prefill_rows.shape[0]:
                ok = st.uid[rec.prefill_rows] == rec.prefill_uids
                for row in rec.prefill_rows[ok].tolist():
                    seq = self.running.seq_of_row[row]
                    assert seq is not None
                    self.kv.cache_prefix(seq)
                    if st.tree_pages[row] > 0:
                        self.running.prefixes.ready(seq)
        self.running.release_deferred_rows()
        self.steps_done += 1
        self._measure(rec, res)
        cpu_ms = (rec.build_cpu_s + time.thread_time() - t0) * 1e3
        self.cpu_ms_ema = cpu_ms if self.steps_done == 1 else 0.9 * self.cpu_ms_ema + 0.1 * cpu_ms
        if self.config.debug_invariants:
            self.check_invariant()
        if early_sent:
            return None
        return held if held is not None else self._out.take()

    @property
    def ms_per_token(self) -> float:
        """The measured cost of one prefill token on the device (0: not measured yet)."""
        return self.step_cost.prefill_ms_per_token

    def _measure(self, rec: InFlight, res: SampledTokens) -> None:
        decodes = int(rec.rows.shape[0] - rec.prefill_rows.shape[0])
        # Proposals ride with their decodes, like them reading the weights once: they are
        # not prefill work.
        prefill = rec.tokens - decodes - rec.draft_tokens
        self.decode_tokens_total += decodes + rec.draft_tokens
        self.prefill_tokens_total += prefill
        self.step_cost.observe(decodes, prefill, res.forward_ms)

    def _apply_tokens(self, rec: InFlight, res: SampledTokens) -> None:
        if res.counts.shape[0]:
            self._apply_verified(rec, res)
            return
        st = self.st
        rows, toks = rec.sampled_rows, res.token_ids.astype(np.int32, copy=False)
        valid = st.uid[rows] == rec.sampled_uids
        all_valid = bool(valid.all())
        if not all_valid:
            rows, toks = rows[valid], toks[valid]
        if not rows.shape[0]:
            return
        pos = st.n_known[rows]
        st.tokens[rows, pos] = toks
        st.n_known[rows] = pos + 1
        st.pending[rows] -= 1
        ends = None
        if res.grammar_end.shape[0]:
            ends = res.grammar_end if all_valid else res.grammar_end[valid]
        logprobs = None
        if res.logprobs.shape[0]:
            pick = slice(None) if all_valid else valid
            logprobs = (res.logprobs[pick], res.top_ids[pick], res.top_logprobs[pick])
        self._emit(rows, toks, None, ends, logprobs)

    def _apply_verified(self, rec: InFlight, res: SampledTokens) -> None:
        """A step whose decodes verified proposals: res.counts[i] tokens for sampled row i.
        Verify rows roll their KV back to what was accepted; every row keeps its tokens up
        to its first stop token (the rest were never generated)."""
        st = self.st
        rows, counts = rec.sampled_rows, res.counts.astype(np.int64)
        toks = res.token_ids.astype(np.int32, copy=False)
        valid = st.uid[rows] == rec.sampled_uids
        drafts = rec.draft_lens if rec.draft_lens is not None else np.zeros_like(counts)
        verified = valid & (drafts > 0)
        if verified.any():
            v_rows = rows[verified]
            drafted = drafts[verified]
            accepted = counts[verified] - 1
            assert rec.sampled_seq_lens is not None
            # The verify wrote KV for its input and every proposal; the input and the
            # accepted proposals stay.
            kv_after = rec.sampled_seq_lens[verified] - drafted + accepted
            st.drafts[v_rows] -= drafted
            # A chained verify of the row is in flight: it stands if every proposal was kept.
            chained = st.pending[v_rows] > 1
            void = chained & (accepted < drafted)
            if void.any():
                self._void_chained(v_rows[void])
                st.pending[v_rows[void]] -= 1
            back = ~chained | void
            freed: list[np.ndarray] = []
            for row, kv in zip(v_rows[back].tolist(), kv_after[back].tolist(), strict=True):
                rollback(st, row, kv, freed)
            if freed:
                self.kv.allocator.free(np.concatenate(freed))
            if self.spec is not None:
                self.spec.on_verified(v_rows, drafted, accepted, rec.step)
                self.spec.stats.void_steps += int(void.sum())
        keep = np.repeat(valid, counts)  # per token of res.token_ids
        ends = res.grammar_end[valid] if res.grammar_end.shape[0] else None
        rows, counts = rows[valid], counts[valid]
        if not rows.shape[0]:
            return
        toks = toks[keep]
        n = int(counts.sum())
        owner = np.repeat(np.arange(rows.shape[0]), counts)
        first = np.cumsum(counts) - counts
        within = np.arange(n) - first[owner]
        # A row's first stop token ends it there (EOS unless ignore_eos, its stop ids; a row
        # with proposals has its min_tokens out already).
        stop = finish.stop_tokens(st, rows, owner, toks, self.config.eos_token_ids,
                                  self.running.seq_of_row)
        if stop.any():
            first_stop = np.minimum.reduceat(np.where(stop, within, n), first)
            counts = np.minimum(counts, first_stop + 1)
            kept = within < counts[owner]
            owner, within, toks = owner[kept], within[kept], toks[kept]
            keep[np.flatnonzero(keep)[~kept]] = False
        pos = st.n_known[rows]
        st.tokens[rows[owner], pos[owner] + within] = toks
        st.n_known[rows] = pos + counts
        st.pending[rows] -= 1
        logprobs = None
        if res.logprobs.shape[0]:
            logprobs = (res.logprobs[keep], res.top_ids[keep], res.top_logprobs[keep])
        self._emit(rows, toks, counts.astype(np.int32), ends, logprobs)

    def _void_chained(self, rows: np.ndarray) -> None:
        """`rows` verified in a later step in flight on the guess that their verify just
        answered kept every proposal, and it did not: that step's part for them is void. Its
        record forgets them (their result is ignored, like a retracted row's) and their
        proposals there no longer count; the caller rolls their KV back."""
        st = self.st
        for later in self.inflight:
            if later.draft_lens is None:
                continue
            hit = np.isin(later.sampled_rows, rows) & \
                (later.sampled_uids == st.uid[later.sampled_rows])
            if not hit.any():
                continue
            st.drafts[later.sampled_rows[hit]] -= later.draft_lens[hit]
            later.sampled_uids = np.where(hit, FORGOTTEN_UID, later.sampled_uids)
            gone = np.isin(later.rows, later.sampled_rows[hit])
            later.uids = np.where(gone, FORGOTTEN_UID, later.uids)

    def _emit(self, rows: np.ndarray, toks: np.ndarray, counts: np.ndarray | None,
              ends: np.ndarray | None,
              logprobs: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> None:
        """Tokens appended to `rows` (counts[i] each, one each when None; st.n_known counts
        them): finishes, the TokenBatch entries, forks."""
        st, running = self.st, self.running
        last = toks if counts is None else toks[np.cumsum(counts) - 1]
        fin = finish.detect(st, rows, last, self.config.eos_token_ids, running.seq_of_row, ends)
        row_list = rows.tolist()
        fresh: list[Request] = []
        if st.fresh[rows].any():
            for r in rows[st.fresh[rows]].tolist():
                st.fresh[r] = False
                fresh.append(running.seqs[r].req)
        self._out.add_tokens([running.rid_of_row[r] for r in row_list], st.index[rows].tolist(),
                             fresh, toks, fin.reasons, fin.matched,
                             st.prompt_len[rows].tolist(), st.cached[rows].tolist(), logprobs,
                             counts)
        if running.fork_rows:
            for row in running.fork_rows.intersection(row_list):
                self._fork(running.seqs[row])
        for i in fin.done:
            seq = running.seqs[row_list[i]]
            running.unbind(seq, insert=True)
            self._finished(seq)
            self.finished_total += 1
        for i in fin.failed:
            seq = running.seq_of_row[row_list[i]]
            if seq is not None:
                self._fail_request(seq.req, 500, "the grammar engine could not follow this "
                                   "request's output; the server log has the details")

    def _apply_prompt_logprobs(self, rec: InFlight, res: SampledTokens) -> None:
        """Pass on the prompt logprobs of requests scoring their prompt (a stale row's are
        dropped: it reports them again when it recomputes)."""
        n_top = res.prompt_top_ids.shape[1] if res.prompt_top_ids.ndim == 2 else 0
        offset = 0
        for sc in rec.scored:
            k = sc.computed
            lps = res.prompt_logprobs[offset:offset + k]
            tops = res.prompt_top_ids[offset:offset + k] if n_top else \
                np.zeros((k, 0), np.int32)
            top_lps = res.prompt_top_logprobs[offset:offset + k] if n_top else \
                np.zeros((k, 0), np.float32)
            offset += k
            seq = self.running.seq_of_row[sc.row]
            if seq is None or int(self.st.uid[sc.row]) != sc.uid:
                continue
            if sc.first:  # the prompt's first token has no logprob
                lps = np.concatenate([np.full(1, np.nan, np.float32), lps])
                tops = np.concatenate([np.full((1, n_top), -1, np.int32), tops])
                top_lps = np.concatenate([np.full((1, n_top), -np.inf, np.float32), top_lps])
            self._out.add_prompt(seq.req, sc.ids, lps, tops, top_lps)
            seq.prompt_scored = max(seq.prompt_scored, sc.end)

    def _apply_embeddings(self, rec: InFlight, res: SampledTokens) -> None:
        """Pool the chunks' hidden states; a prompt's last chunk gives its embedding."""
        if res.embeddings.shape[0] != len(rec.embedded):
            log.error("step %d: %d embeddings for %d requests", rec.step,
                      res.embeddings.shape[0], len(rec.embedded))
            return
        for emb, vector in zip(rec.embedded, res.embeddings, strict=True):
            seq = self.running.seq_of_row[emb.row]
            if seq is None or int(self.st.uid[emb.row]) != emb.uid:
                continue  # retracted: it recomputes from its first chunk
            if seq.req.sampling.embed == "mean":
                if emb.start == 0:
                    seq.embed_sum = np.zeros(vector.shape[0], dtype=np.float64)
                assert seq.embed_sum is not None
                seq.embed_sum += vector
            if emb.final:
                out = vector if seq.embed_sum is None else seq.embed_sum / seq.req.prompt_len
                self._out.add_embedding(seq.req, np.asarray(out, dtype=np.float32))
                seq.embed_sum = None

    def _finish_prefill_only(self, rec: InFlight) -> None:
        """A request with max_tokens 0 (a scored prompt) ends once its prompt is in KV."""
        st = self.st
        if not rec.prefill_rows.shape[0]:
            return
        ok = st.uid[rec.prefill_rows] == rec.prefill_uids
        rows = rec.prefill_rows[ok]
        done = rows[(st.max_total[rows] <= st.n_known[rows]) & (st.pending[rows] == 0)
                    & (st.kv_done[rows] >= st.n_known[rows])]
        for row in done.tolist():
            seq = self.running.seq_of_row[row]
            if seq is None:
                continue
            cached = max(seq.cached_tokens, 0)
            self.running.unbind(seq, insert=True)
            self._finished(seq)
            self._out.add_finish(seq.req, seq.index, "length", cached)
            self.finished_total += 1

    def _fork(self, seq: Sequence) -> None:
        """Index 0 has its prompt in KV (and, after this step, in the cache): start the other
        samples, which find the prompt's pages there and compute only the last partial page."""
        self.running.fork_rows.discard(seq.row)
        for sib in seq.req.fork_pending:
            self.waiting.push(sib)
        seq.req.fork_pending = []

    def _fail_records(self, records: list[InFlight], status: int, message: str) -> None:
        st = self.st
        reqs: dict[str, Request] = {}
        for rec in records:
            same = st.uid[rec.rows] == rec.uids
            for row in rec.rows[same].tolist():
                seq = self.running.seq_of_row[row]
                if seq is not None:
                    reqs[seq.req.rid] = seq.req
        for req in reqs.values():
            log.error("request %s failed: %s", req.rid, message)
            self._fail_request(req, status, message)

    def fail_inflight(self, message: str, status: int = 503) -> None:
        """The worker stopped answering: fail the requests of every step in flight."""
        records = list(self.inflight)
        self.inflight.clear()
        # Their rows stay reserved (deferred) until the worker answers these steps late, or
        # forever if it never does: a slow worker that wakes up must not read reused rows.
        self._fail_records(records, status, message)

    # ---------------------------------------------------------------------------- metrics
    def stats(self) -> dict[str, float]:
        query = self.cache_query_tokens
        return {
            "running": float(len(self.running)),
            "waiting": float(len(self.waiting)),
            "retracted_total": float(self.retracted_total),
            "finished_total": float(self.finished_total),
            "aborted_total": float(self.aborted_total),
            "cache_hit_tokens": float(self.cache_hit_tokens),
            "cache_query_tokens": float(query),
            "cache_hit_rate": self.cache_hit_tokens / query if query else 0.0,
            **(kv := self.kv.stats(self.running.active_rows())),  # check_invariant(): O(pages)
            # pages held by running requests (cached-only pages are reclaimable)
            "kv_usage_ratio": kv["kv_pages_running"] / kv["kv_pages_total"]
            if kv["kv_pages_total"] else 0.0,
            "sched_cpu_ms_per_step": self.cpu_ms_ema,
            "prefill_ms_per_token": self.ms_per_token,
            "decode_step_ms": self.step_cost.decode_ms,
            "step_token_budget": float(self.planner.token_budget(len(self.running))),
            "steps": float(self.steps_done),
            "decode_tokens_total": float(self.decode_tokens_total),
            "prefill_tokens_total": float(self.prefill_tokens_total),
            "inflight_steps": float(len(self.inflight)),
            **self._spec_stats(),
        }

    def _spec_stats(self) -> dict[str, float]:
        if self.spec is None:
            return {}
        spec = self.spec.stats
        return {"spec_verify_steps_total": float(spec.verify_steps),
                "spec_draft_tokens_total": float(spec.draft_tokens),
                "spec_accepted_tokens_total": float(spec.accepted_tokens),
                "spec_chained_steps_total": float(spec.chained_steps),
                "spec_void_steps_total": float(spec.void_steps),
                "spec_accept_length": spec.accept_length}

    def check_invariant(self) -> None:
        check(self.running)
        seqs = self.waiting.sequences()
        assert len(seqs) == len(self.waiting), "the waiting queue's count is off"
        assert sum(int(s.tokens.shape[0]) for s in seqs) == self.waiting.tokens, \
            "the waiting queue's token count is off"


def _shape_problem(rec: InFlight, res: SampledTokens) -> str | None:
    """Why a result cannot be the answer to `rec` (None when its shape fits)."""
    sampled = rec.sampled_rows.shape[0]
    if not res.counts.shape[0]:
        if res.token_ids.shape[0] != sampled:
            return f"the worker returned {res.token_ids.shape[0]} tokens for {sampled} requests"
        return None
    drafts = rec.draft_lens if rec.draft_lens is not None else np.zeros(sampled, np.int32)
    counts = res.counts
    if counts.shape[0] != sampled or int(counts.sum()) != res.token_ids.shape[0] \
            or bool((counts < 1).any()) or bool((counts > drafts + 1).any()):
        return (f"the worker returned {res.token_ids.shape[0]} tokens in counts "
                f"{counts.tolist()[:8]} for {sampled} requests with proposals "
                f"{drafts.tolist()[:8]}")
    return None
