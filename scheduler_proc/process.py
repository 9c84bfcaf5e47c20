"""The scheduler process: `python -m tessera.scheduler_proc --run-dir DIR`.

Started with the worker ranks; it is ready once they are. Inboxes (one shared buffer, so one wait covers both):
  RunPaths.scheduler          TokenizedRequest, AbortRequest, FlushCache (tokenizer, detokenizer)
  RunPaths.scheduler_results  WorkerReady (every rank, at start), SampledTokens and
                              GrammarReady (the rank whose WorkerReady says it answers)
Outboxes: RunPaths.worker(r) for every rank (ForwardBatch; GrammarInit to the answering rank
only), RunPaths.detokenizer (TokenBatch, ErrorReply). Every send has a timeout; nothing here
waits on a socket without one.

Each loop iteration: handle what arrived (results first in arrival order), then launch steps
until the pipeline is full (two in flight with overlap: the worker never waits for us; as many
as the workers hold when they say so, e.g. one per pipeline stage), then check the worker's
deadline. A worker silent for `step_timeout_s` gets its requests failed
with 503; the process stays up for the next ones.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from tessera.bus.channel import Inbox, Outbox, SendTimeout
from tessera.bus.codec import encode
from tessera.bus.messages import (
    AbortRequest,
    ErrorReply,
    FlushCache,
    ForwardBatch,
    GrammarReady,
    Message,
    ResetRequests,
    SampledTokens,
    TokenBatch,
    TokenizedRequest,
    WorkerReady,
)
from tessera.bus.process import BusProcess
from tessera.bus.run_paths import RunPaths
from tessera.bus.stats import StatHistogram
from tessera.config import READY_TIMEOUT_S, EngineConfig
from tessera.scheduler_proc.config import SchedulerConfig
from tessera.scheduler_proc.page_table import SharedPageTable
from tessera.scheduler_proc.scheduler import Scheduler
from tessera.scheduler_proc.throughput_log import ThroughputLog

log = logging.getLogger(__name__)

MAX_BACKLOG = 10_000


class SchedulerProcess(BusProcess):
    name = "scheduler"

    def __init__(self, paths: RunPaths, config: EngineConfig) -> None:
        super().__init__(paths, config)
        # Started beside the workers: it waits as long as they may take to load.
        self.ready_timeout_s = READY_TIMEOUT_S["worker"] + READY_TIMEOUT_S["scheduler"]
        self.step_timeout_s = config.step_timeout_s
        self.sched: Scheduler | None = None
        self.table: SharedPageTable | None = None
        self.results: Inbox | None = None
        self.workers: list[Outbox] = []
        self.detok: Outbox | None = None
        self.ready_msg: WorkerReady | None = None
        self.answering = 0  # the rank that returns tokens and takes grammars
        self._early: list[Message] = []
        self._rejected: deque[TokenizedRequest] = deque()  # inbox full (receiver thread)
        self._backlog: deque[Message] = deque()  # detokenizer did not take these in time
        # Outputs of results handled this turn, sent once the next steps are (tick).
        self._deferred: list[Message] = []
        self._last_expire = 0.0
        self.batches_sent = 0
        self.send_failures = 0
        self.step_seconds = StatHistogram("step_seconds")  # the worker's time per step
        self.throughput_log = ThroughputLog(config.log_interval_s)

    # -- start-up -----------------------------------------------------------------------------
    def setup(self) -> None:
        cfg, paths = self.config, self.paths
        poll = cfg.inbox_busy_poll_s()
        self.inbox = Inbox(paths.scheduler, name="scheduler", on_reject=self._on_reject,
                           busy_poll_s=poll)
        self.results = Inbox(paths.scheduler_results, name="scheduler-results",
                             buffer=self.inbox.buffer, busy_poll_s=poll)
        ready = self._wait_for_workers()
        self.ready_msg = ready
        self.table = SharedPageTable(paths.shm_req_to_token, cfg.max_running_requests,
                                     ready.max_context_len)
        sc = SchedulerConfig.from_engine(cfg, ready)
        self.sched = Scheduler(sc, self.table.array)
        self.workers = [Outbox(paths.worker(r), timeout_ms=cfg.send_timeout_ms)
                        for r in range(cfg.world_size)]
        self.detok = Outbox(paths.detokenizer, timeout_ms=cfg.send_timeout_ms)
        # Whatever the detokenizer still tracks ran on a scheduler before this one.
        self._emit(ResetRequests(reason="the engine's scheduler restarted"))
        log.info("scheduler: %d KV pages of %d tokens, context %d, %d rows, overlap %s, "
                 "radix cache %s", self.sched.allocator.total_pages, sc.page_size,
                 sc.max_context_len, sc.max_running_requests, sc.overlap,
                 "off" if sc.disable_radix_cache else "on")
        if self._early:
            self.handle(self._early)
            self._early = []

    def _wait_for_workers(self) -> WorkerReady:
        assert self.inbox is not None
        want = self.config.world_size
        readies: dict[int, WorkerReady] = {}
        deadline = time.monotonic() + self.ready_timeout_s
        while len(readies) < want:
            left = deadline - time.monotonic()
            if left <= 0 or self.stopping:
                missing = sorted(set(range(want)) - set(readies))
                raise RuntimeError(
                    f"no WorkerReady from worker rank(s) {missing} within "
                    f"{self.ready_timeout_s:.0f} s on {self.paths.scheduler_results}: start the "
                    f"workers first and check their logs")
            for msg in self.inbox.drain(min(left, 0.5)):
                if isinstance(msg, WorkerReady):
                    readies[msg.rank] = msg
                else:
                    self._early.append(msg)
        first = readies[0]
        for r in readies.values():
            if (r.num_slots, r.page_size, r.max_context_len, r.batches_in_flight) != \
                    (first.num_slots, first.page_size, first.max_context_len,
                     first.batches_in_flight):
                raise RuntimeError(f"worker ranks disagree on the KV arena: rank {r.rank} "
                                   f"{r.num_slots}/{r.page_size}/{r.max_context_len}, rank 0 "
                                   f"{first.num_slots}/{first.page_size}/{first.max_context_len}")
        answering = [r.rank for r in readies.values() if r.answers]
        if len(answering) > 1:
            raise RuntimeError(f"worker ranks {answering} all say they return the tokens")
        self.answering = answering[0] if answering else 0
        return readies[self.answering]

    def ready_info(self) -> dict[str, Any]:
        if self.sched is None:
            return {}
        return {"kv_pages": self.sched.allocator.total_pages,
                "page_size": self.sched.page_size,
                "max_context_len": self.sched.config.max_context_len,
                "shm_req_to_token": self.paths.shm_req_to_token}

    # -- the loop -----------------------------------------------------------------------------
    def _on_reject(self, msg: Message) -> None:
        if isinstance(msg, TokenizedRequest):
            self._rejected.append(msg)

    def handle(self, msgs: list[Message]) -> None:
        sched = self.sched
        if sched is None:
            self._early.extend(msgs)
            return
        for msg in msgs:
            if isinstance(msg, SampledTokens):
                if msg.error is None and msg.forward_ms:
                    self.step_seconds.observe(msg.forward_ms / 1000.0)
                # A request's first token goes out at once (its time to first token waits
                # on it), before the scheduler files its prompt in the prefix cache, while
                # the worker still has a step to run: the next batch is sent a moment later,
                # once per request, and the device is not left waiting for it.
                out = sched.on_result(msg, early=self._emit_first_tokens)
                if out is not None:
                    self._deferred.append(out)
            elif isinstance(msg, TokenizedRequest):
                error = sched.add_request(msg)
                if error is not None:
                    log.info("refused %s: %s", msg.rid, error.message)
                    self._emit(error)
            elif isinstance(msg, AbortRequest):
                sched.abort(msg.rid, msg.reason, msg.index)
            elif isinstance(msg, GrammarReady):
                sched.on_grammar_ready(msg)
            elif isinstance(msg, FlushCache):
                log.info("flushed %d cached KV pages (%s)", sched.flush_cache(), msg.reason)
            elif isinstance(msg, WorkerReady):
                log.warning("WorkerReady from rank %d after start-up: ignored", msg.rank)
            else:
                log.warning("scheduler: unexpected %s dropped", type(msg).__name__)

    def tick(self) -> None:
        sched = self.sched
        assert sched is not None
        while self._rejected:
            req = self._rejected.popleft()
            self._emit(ErrorReply(rid=req.rid, status=503, error_type="server_error",
                                  message="the scheduler's inbox is full; retry later",
                                  reply_to=req.detok.reply_to))
        self._send_grammar_inits()
        self.throughput_log.maybe_log(sched.stats)
        while (batch := sched.next_batch()) is not None:
            self._send_batch(batch)
        # A step's output leaves after the next step is on its way: the worker's next batch
        # is what the device waits for, the detokenizer can take it a moment later.
        self._emit_deferred()
        if sched.inflight and time.monotonic() - sched.inflight[0].sent_at > self.step_timeout_s:
            log.error("worker did not answer step %d within %.0f s: failing its requests",
                      sched.inflight[0].step, self.step_timeout_s)
            sched.fail_inflight(f"the model worker did not answer within "
                                f"{self.step_timeout_s:.0f} s; retry later")
        now = time.monotonic()
        if now - self._last_expire > 1.0:
            self._last_expire = now
            sched.expire_waiting(self.config.request_timeout_s, now)
        self._emit(sched.take_output())
        for error in sched.take_errors():
            self._emit(error)
        self._flush_backlog()

    def _emit_first_tokens(self, out: TokenBatch) -> None:
        self._deferred.append(out)  # behind what is already waiting: the detokenizer's order
        self._emit_deferred()

    def _emit_deferred(self) -> None:
        for out in self._deferred:
            self._emit(out)
        self._deferred.clear()

    def _send_grammar_inits(self) -> None:
        """The answering rank holds the grammar matchers (it samples the tokens every rank
        adopts)."""
        assert self.sched is not None
        for init in self.sched.take_grammar_inits():
            try:
                self.workers[self.answering].send(init)
            except SendTimeout as exc:
                log.error("cannot send a grammar to worker %d: %s", self.answering, exc)
                self.sched.on_grammar_ready(GrammarReady(
                    first_id=init.first_id, error=f"the model worker is not accepting work "
                                                  f"({exc}); retry later"), 503)

    def _send_batch(self, batch: ForwardBatch) -> None:
        frames = encode(batch)
        try:
            for box in self.workers:
                box.send_frames(frames)
            self.batches_sent += 1
        except SendTimeout as exc:
            self.send_failures += 1
            log.error("cannot send step %d to the worker: %s", batch.step, exc)
            assert self.sched is not None
            self.sched.fail_inflight(f"the model worker is not accepting work ({exc}); "
                                     f"retry later")

    def _emit(self, msg: Message | None) -> None:
        if msg is None:
            return
        if self._backlog:
            self._backlog.append(msg)  # keep the order the detokenizer relies on
            return
        try:
            assert self.detok is not None
            self.detok.send(msg)
        except SendTimeout:
            log.warning("detokenizer slow: queueing output")
            self._backlog.append(msg)

    def _flush_backlog(self) -> None:
        assert self.detok is not None
        while self._backlog:
            try:
                self.detok.send(self._backlog[0], timeout_ms=0)
            except SendTimeout:
                if len(self._backlog) > MAX_BACKLOG:
                    self._backlog.popleft()
                    log.error("detokenizer unreachable: dropped an output message")
                return
            self._backlog.popleft()

    def stats(self) -> dict[str, float]:
        out = dict(self.sched.stats()) if self.sched is not None else {}
        out["batches_sent"] = float(self.batches_sent)
        out["detokenizer_messages_sent"] = float(self.detok.sent if self.detok else 0)
        out["send_failures"] = float(self.send_failures)
        out["output_backlog"] = float(len(self._backlog))
        out.update(self.step_seconds.stats())
        if self.sched is not None:
            out["grammars_compiling"] = float(self.sched.grammars_compiling)
        return out

    def teardown(self) -> None:
        for box in self.workers:
            box.close()
        if self.detok is not None:
            self.detok.close()
        if self.results is not None:
            self.results.close()
        if self.table is not None:
            self.table.close()
