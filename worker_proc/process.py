"""The worker process: `python -m tessera.worker_proc --run-dir DIR --rank R`.

One process per TP rank. Inbox RunPaths.worker(rank): ForwardBatch (every rank gets the same
batches in the same order). Outbox RunPaths.scheduler_results: WorkerReady once the model is
loaded and the KV arena carved; then (rank 0 only) one SampledTokens per ForwardBatch, sent as
zero-copy frames. A step that fails answers with SampledTokens.error so the scheduler can
abort its requests; the process stays up. Rank 0 also takes GrammarInit and answers each with
a GrammarReady once the grammar is compiled (worker_proc/grammar/).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

import numpy as np

from tessera.bus.channel import Inbox, Outbox, SendTimeout
from tessera.bus.messages import ForwardBatch, GrammarInit, GrammarReady, Message, SampledTokens
from tessera.bus.process import BusProcess
from tessera.bus.run_paths import RunPaths
from tessera.config import EngineConfig
from tessera.hal.facts import platform_facts

log = logging.getLogger(__name__)


def resident_bytes() -> int:
    """This process's resident memory (Linux /proc; the peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class WorkerProcess(BusProcess):
    name = "worker"

    def __init__(self, paths: RunPaths, config: EngineConfig, rank: int = 0) -> None:
        super().__init__(paths, config)
        self.rank = rank
        self.name = f"worker{rank}"
        self.runner: Any = None
        self.results: Outbox | None = None
        self.table: Any = None
        self.communicator: Any = None
        self.steps = 0
        self.failed_steps = 0
        self.tokens = 0
        self.forward_ms_total = 0.0
        self.pending: tuple[Any, float] | None = None
        self._last_done = 0.0  # when the last step's result was taken

    def setup(self) -> None:
        from tessera.hal import host_threads

        wait_policy = host_threads.set_wait_policy()  # before torch is imported
        from tessera.hal.registry import load_platform
        from tessera.worker_proc.dist_init import communicator_args
        from tessera.worker_proc.model_runner import ModelRunner
        from tessera.worker_proc.page_table import AttachedPageTable

        cfg = self.config
        if not 0 <= self.rank < cfg.tp_size:
            raise ValueError(f"--rank {self.rank} is outside --tp-size {cfg.tp_size}")
        if cfg.verify_weights or cfg.verify_key:
            self._verify_weights()
        self.inbox = Inbox(self.paths.worker(self.rank), name=self.name)
        threads = host_threads.apply_thread_count(cfg.intra_op_threads, cfg.tp_size)
        log.info("%s: %d intra-op threads, OpenMP wait policy %s", self.name, threads,
                 wait_policy)
        start = time.perf_counter()
        platform = load_platform(cfg.hal)
        if cfg.tp_size > 1:
            how = communicator_args(cfg, self.rank, self.paths)
            self.communicator = platform.create_communicator(self.rank, cfg.tp_size,
                                                             how.init_method, **how.extra)
        platform_s = time.perf_counter() - start
        self.runner = ModelRunner(cfg, self.rank, platform, self.communicator)
        self.runner.phases = {"platform": platform_s, **self.runner.phases}
        self.table = AttachedPageTable(self.paths.shm_req_to_token, cfg.max_running_requests,
                                       self.runner.max_context_len)
        self.results = Outbox(self.paths.scheduler_results, timeout_ms=cfg.send_timeout_ms)
        self.results.send(self.runner.ready_message())

    def _verify_weights(self) -> None:
        """Before anything is read: every start (a restart too) checks the files it loads."""
        from tessera.formats.integrity import verify_model

        cfg = self.config
        if not cfg.verify_weights:
            raise ValueError("--verify-key needs --verify-weights MANIFEST")
        checked = verify_model(cfg.model, cfg.verify_weights, cfg.verify_key)
        log.info("%s: the %d model file(s) match %s%s", self.name, checked, cfg.verify_weights,
                 " (signature valid)" if cfg.verify_key else "")

    def ready_info(self) -> dict[str, Any]:
        if self.runner is None:
            return {}
        plan = self.runner.kv_plan
        return {"rank": self.rank, "device": str(self.runner.device),
                "kv_pages": plan.num_pages, "kv_tokens": plan.usable_tokens,
                "model": self.config.model, "quantization": self.runner.quant.describe(),
                "weight_bytes": self.runner.weight_bytes, "kv_cache_bytes": plan.total_bytes,
                "phases": {k: round(v, 4) for k, v in self.runner.phases.items()},
                "platform": platform_facts(self.runner.platform)}

    def handle(self, msgs: list[Message]) -> None:
        for msg in msgs:
            if isinstance(msg, ForwardBatch):
                self._launch(msg)
            elif isinstance(msg, GrammarInit):
                self._send_grammar_replies(self.runner.grammar_init(msg))
            else:
                log.warning("%s: ignoring unexpected %s", self.name, type(msg).__name__)

    # On a GPU a step is launched, then the previous one is finished: the device starts step
    # n+1 (the scheduler sends it before it has step n's result) while this thread waits for
    # step n's tokens and sends them, so host work hides behind device work. Results still
    # leave in step order. On the CPU launching is computing: each step finishes at once.

    def _launch(self, batch: ForwardBatch) -> None:
        start = time.perf_counter()
        try:
            pending = self.runner.launch(batch, self.table.array)
        except Exception as exc:  # a failed step must not kill the worker
            log.exception("%s: step %d failed", self.name, batch.step)
            self._finish_pending()
            self.failed_steps += 1
            self._done(batch.step, start, SampledTokens(
                step=batch.step, token_ids=np.zeros(0, np.int32),
                error=f"worker {self.rank}: {type(exc).__name__}: {exc}"))
            return
        self.tokens += int(np.asarray(batch.extend_lens).sum())
        self._finish_pending()
        self.pending = (pending, start)
        if not self.runner.asynchronous:
            self._finish_pending()

    def _finish_pending(self) -> None:
        if self.pending is None:
            return
        pending, start = self.pending
        self.pending = None
        try:
            result = self.runner.finish(pending)
        except Exception as exc:
            log.exception("%s: step %d failed", self.name, pending.step)
            self.failed_steps += 1
            result = SampledTokens(step=pending.step, token_ids=np.zeros(0, np.int32),
                                   error=f"worker {self.rank}: {type(exc).__name__}: {exc}")
        self._done(pending.step, start, result)

    def _done(self, step: int, start: float, result: SampledTokens) -> None:
        # The step's own time: from its launch or, when it was queued behind the previous
        # step (pipelined), from that step's end. Launch-to-end would count the previous
        # step's tail too, and the scheduler sizes prefill chunks from this.
        now = time.perf_counter()
        own_ms = (now - max(start, self._last_done)) * 1000.0
        self._last_done = now
        self.steps += 1
        self.forward_ms_total += own_ms
        if result.error is None:
            result = dataclasses.replace(result, forward_ms=own_ms)
        if self.rank != 0:
            return
        assert self.results is not None
        try:
            self.results.send(result)
        except SendTimeout:
            log.error("%s: the scheduler did not take step %d's result in time", self.name,
                      step)

    def _send_grammar_replies(self, replies: list[GrammarReady]) -> None:
        assert self.results is not None
        for reply in replies:
            try:
                self.results.send(reply)
            except SendTimeout:
                log.error("%s: the scheduler did not take a GrammarReady in time", self.name)

    def tick(self) -> None:
        if self.pending is not None and self.pending[0].ready():
            self._finish_pending()
        if self.runner is not None and self.runner.grammars_compiling:
            self._send_grammar_replies(self.runner.grammar_ready())

    def wait_timeout(self) -> float:
        # While a step runs on the device, look often for the next batch (to queue it behind)
        # and for the step's end (to answer at once).
        if self.pending is not None:
            return 0.0002
        # A compile finishing in a pool thread is noticed here: look every few milliseconds.
        compiling = self.runner is not None and self.runner.grammars_compiling
        return 0.002 if compiling else self.loop_timeout_s

    def stats(self) -> dict[str, float]:
        weights = float(self.runner.weight_bytes) if self.runner is not None else 0.0
        return {"steps": float(self.steps), "failed_steps": float(self.failed_steps),
                "tokens": float(self.tokens),
                "forward_ms_avg": self.forward_ms_total / self.steps if self.steps else 0.0,
                "forward_ms_total": self.forward_ms_total,
                "weight_bytes": weights, "rss_bytes": float(resident_bytes())}

    def teardown(self) -> None:
        if self.runner is not None and self.runner.grammar is not None:
            self.runner.grammar.compiler.close()  # idle compile threads must not hold exit
        if self.table is not None:
            self.table.close()
        if self.results is not None:
            self.results.close()
        if self.communicator is not None:
            try:
                self.communicator.destroy()
            except Exception:  # noqa: BLE001 - exiting anyway
                log.debug("communicator destroy failed", exc_info=True)
