"""The worker process: `python -m tessera.worker_proc --run-dir DIR --rank R`.

One process per (pipeline stage, TP rank): rank = stage * tp_size + tp_rank
(worker_proc/parallel.py). Inbox RunPaths.worker(rank): ForwardBatch (every rank gets the
same batches in the same order). Outbox RunPaths.scheduler_results: WorkerReady once the model
is loaded and the KV arena carved; then (the answering rank only: the last stage's TP rank 0)
one SampledTokens per ForwardBatch, sent as zero-copy frames. A step that fails answers with
SampledTokens.error so the scheduler can abort its requests; the process stays up. The
answering rank also takes GrammarInit and answers each with a GrammarReady once the grammar is
compiled (worker_proc/grammar/).

Stopping (SIGTERM): the loop ends, the step in flight gets a moment to finish, and the worker
leaves its communicators: destroyed when every step it started has finished, aborted when one
has not (a peer that stopped first will never join its collectives); each part is bounded in
time, so the worker is gone well within the supervisor's grace.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tessera.bus import trace
from tessera.bus.channel import Inbox, Outbox, SendTimeout
from tessera.bus.messages import ForwardBatch, GrammarInit, GrammarReady, Message, SampledTokens
from tessera.bus.process import BusProcess
from tessera.bus.run_paths import RunPaths
from tessera.bus.stats import RoundTrips
from tessera.config import EngineConfig
from tessera.hal.facts import platform_facts

log = logging.getLogger(__name__)
# A step's launch (host work) longer than this compiled a kernel or waited for the device
# allocator: the largest eager step of an 8B model launches in ~25 ms on an H200's host.
SLOW_LAUNCH_MS = 250.0


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
        self.comms: Any = None  # worker_proc.parallel.Communicators
        self.steps = 0
        self.failed_steps = 0
        self.tokens = 0
        self.forward_ms_total = 0.0
        self.launch_ms_max = 0.0
        self.launch_ms_total = 0.0  # host time inside ModelRunner.launch (asynchronous plugins)
        self.launches_timed = 0
        # The host round trip the device may wait on (the scheduler's turn and the bus).
        # (its depth set again once the plugin resolves an auto --overlap-steps: setup)
        self.round_trips = RoundTrips(config.steps_in_flight)
        self.slow_launches = 0
        self._allocator_seen: dict[str, int] = {}
        self.pending: tuple[Any, float] | None = None
        self._last_done = 0.0  # when the last step's result was taken
        self.launched = 0  # batches launched (the --profile-steps count)
        self.profile: Any = None  # a StepProfile while a --profile-steps window runs
        self._profile_windows = config.profile_windows()

    def setup(self) -> None:
        from tessera.hal import host_threads

        wait_policy = host_threads.set_wait_policy()  # before torch is imported
        from tessera.formats.parallel import devices_problem
        from tessera.hal.registry import load_platform
        from tessera.worker_proc.dist_init import communicator_args
        from tessera.worker_proc.model_runner import ModelRunner
        from tessera.worker_proc.page_table import AttachedPageTable
        from tessera.worker_proc.parallel import Communicators, RankLayout

        cfg = self.config
        layout = RankLayout(self.rank, cfg.tp_size, cfg.pp_size)
        if cfg.verify_weights or cfg.verify_key:
            self._verify_weights()
        self.inbox = Inbox(self.paths.worker(self.rank), name=self.name,
                           busy_poll_s=cfg.inbox_busy_poll_s())
        threads = host_threads.apply_thread_count(cfg.intra_op_threads, cfg.world_size)
        log.info("%s: %d intra-op threads, OpenMP wait policy %s", self.name, threads,
                 wait_policy)
        start = time.perf_counter()
        platform = load_platform(cfg.hal)
        self.round_trips = RoundTrips(cfg.steps_in_flight_with(
            platform.capabilities.overlap_steps))
        platform.use_device(cfg.device_index(self.rank))
        if not platform.capabilities.devices_shared:
            problem = devices_problem(cfg.ranks_per_node, cfg.tp_size, cfg.pp_size,
                                      platform.device_count(), platform.name)
            if problem:
                raise ValueError(problem)
        how = communicator_args(cfg, self.rank, self.paths)
        self.comms = Communicators.create(platform, layout, how.init_method, **how.extra)
        platform_s = time.perf_counter() - start
        self.runner = ModelRunner(cfg, self.rank, platform, self.comms.tp,
                                  world=self.comms.world)
        self.runner.phases = {"platform": platform_s, **self.runner.phases}
        self.table = AttachedPageTable(self.paths.shm_req_to_token, cfg.max_running_requests,
                                       self.runner.max_context_len)
        self.results = Outbox(self.paths.scheduler_results, timeout_ms=cfg.send_timeout_ms)
        # What compiled while loading and capturing is not news: a launch names only what
        # compiled while serving.
        self.runner.platform.recent_compiles()
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
    # leave in step order. On a synchronous plugin launching is computing: each step finishes
    # at once.

    def _launch(self, batch: ForwardBatch) -> None:
        self._profile_turn()
        self.launched += 1
        start = time.perf_counter()
        self.round_trips.arrived(batch.step, start)
        trace.note_launch(self.name, batch)
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
        if trace.active():
            # the tokens the device runs: a graph's padded size, or the step's own (eager)
            trace.note("launched", self.name, "ForwardBatch", step=batch.step,
                       padded=self.runner.padded_tokens)
        if self.runner.asynchronous:  # a synchronous plugin computes the step in its launch
            self._note_launch(batch, (time.perf_counter() - start) * 1000.0)
        self._finish_pending()
        self.pending = (pending, start)
        if not self.runner.asynchronous:
            self._finish_pending()

    def _profile_turn(self) -> None:
        """--profile-dir: the plugin's profiler starts before a window's first launch and
        stops (every step of the window finished) before the launch after its last."""
        if not self._profile_windows or self.runner is None:
            return
        window = self._profile_windows[0]
        if self.launched == window.start and self.profile is None:
            self._finish_pending()  # the window holds its own steps only
            log.info("%s: profiling steps %d-%d", self.name, window.start, window.stop - 1)
            self.profile = self.runner.platform.start_profile()
        elif self.launched == window.stop and self.profile is not None:
            self._finish_pending()
            self._stop_profile()

    def _stop_profile(self) -> None:
        window = self._profile_windows.pop(0)
        profile, self.profile = self.profile, None
        assert self.config.profile_dir
        os.makedirs(self.config.profile_dir, exist_ok=True)
        prefix = os.path.join(self.config.profile_dir,
                              f"{self.name}.steps{window.start}-{window.stop - 1}")
        steps = min(self.launched, window.stop) - window.start
        try:
            summary = profile.stop(prefix, rank=self.rank, steps=steps,
                                   first_step=window.start)
        except Exception:  # noqa: BLE001 - a profile must not take the worker down
            log.exception("%s: writing the profile failed", self.name)
            return
        log.info("%s: profile of %d steps written to %s.* (%.1f ms of device time in "
                 "%.1f ms)", self.name, steps, prefix, summary["device_us"] / 1000.0,
                 summary["wall_s"] * 1000.0)

    def _note_launch(self, batch: ForwardBatch, launch_ms: float) -> None:
        """A launch is host work: tens of milliseconds for the largest eager step. One that
        takes longer compiled a kernel or waited for the device allocator while serving: said
        once per occurrence, with the allocator's events since the last such report."""
        self.launch_ms_max = max(self.launch_ms_max, launch_ms)
        self.launch_ms_total += launch_ms
        self.launches_timed += 1
        compiled = self.runner.platform.recent_compiles()
        if launch_ms <= SLOW_LAUNCH_MS:
            if compiled:
                # Not slow enough to warn of, but a compile while serving is worth naming: a
                # benchmark's counters say one happened, this line says which and where.
                log.info("%s: step %d compiled while serving (launch %.0f ms, %d tokens): %s",
                         self.name, batch.step, launch_ms,
                         int(np.asarray(batch.extend_lens).sum()), " | ".join(compiled))
            return
        self.slow_launches += 1
        counters = self.runner.platform.allocator_counters()
        delta = {k: v - self._allocator_seen.get(k, 0) for k, v in counters.items()}
        self._allocator_seen = counters
        extend = np.asarray(batch.extend_lens)
        log.warning("%s: step %d took %.0f ms to launch (%d tokens, %d requests; allocator "
                    "since the last report: %s): a kernel compiled or memory was reclaimed "
                    "while serving%s", self.name, batch.step, launch_ms, int(extend.sum()),
                    int(extend.shape[0]), delta or "no counters",
                    "; kernels compiled since the last report: " + " | ".join(compiled)
                    if compiled else "")

    def _finish_pending(self) -> None:
        if self.pending is None:
            return
        pending, start = self.pending
        if not self._wait_until(pending.ready):
            return  # stopping, and the device never finished: teardown aborts
        self.pending = None
        if trace.active():
            trace.note("ready", self.name, "ForwardBatch", step=pending.step)
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
        if not self.runner.answers:
            return
        assert self.results is not None
        try:
            self.results.send(result)
        except SendTimeout:
            log.error("%s: the scheduler did not take step %d's result in time", self.name,
                      step)
        self.round_trips.answered(step, now)

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
                "launch_ms_max": self.launch_ms_max, "slow_launches": float(self.slow_launches),
                "launch_ms_total": self.launch_ms_total,
                "launches_timed": float(self.launches_timed),
                **self.round_trips.stats(),
                "weight_bytes": weights, "rss_bytes": float(resident_bytes()),
                "all_reduce_one_shot_bytes": float(self._one_shot_bytes()),
                "kernel_compiles": float(self._kernel_compiles())}

    def _kernel_compiles(self) -> int:
        """Kernels the plugin compiled so far (its `kernel_compiles` counter; 0 if none)."""
        if self.runner is None:
            return 0
        return int(self.runner.platform.allocator_counters().get("kernel_compiles", 0))

    def _one_shot_bytes(self) -> int:
        """The largest TP all-reduce on the plugin's one-shot path (0: none, or one rank)."""
        comm = self.runner.communicator if self.runner is not None else None
        return comm.one_shot_max_bytes if comm is not None else 0

    def _wait_until(self, done: Callable[[], bool], timeout_s: float | None = None) -> bool:
        """Wait for `done()` without blocking in the device (a wait inside a driver call
        would hold off SIGTERM forever when a peer never joins a collective); gives up when
        the process is stopping (or after `timeout_s`)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not done():
            if (self.stopping and deadline is None) or \
                    (deadline is not None and time.monotonic() > deadline):
                return False
            time.sleep(0)  # lets the signal handler and the socket threads run
        return True

    def teardown(self) -> None:
        # The step in flight may still finish; one that does not waits on a peer.
        settled = self.pending is None or self._wait_until(self.pending[0].ready,
                                                            STEP_SETTLE_S)
        if self.profile is not None and settled:
            self._stop_profile()  # the window was not reached: what it holds so far
        if self.runner is not None and self.runner.grammar is not None:
            self.runner.grammar.compiler.close()  # idle compile threads must not hold exit
        if self.table is not None:
            self.table.close()
        if self.results is not None:
            self.results.close()
        if self.comms is not None:
            leave_within(self.comms, settled, COMM_LEAVE_S, self.name)


STEP_SETTLE_S = 0.5  # a step still running at SIGTERM gets this long to finish
COMM_LEAVE_S = 1.0  # destroying (or aborting) the communicators gets this long


def leave_within(comms: Any, cleanly: bool, timeout_s: float, name: str) -> bool:
    """comms.leave(cleanly) in a thread of its own, given `timeout_s`; an orderly destroy that
    does not finish in time (a peer is gone) is followed by an abort, given as long. True if
    the communicators were left. The process exits right after, whatever this returns."""

    def attempt(clean: bool) -> bool:
        def run() -> None:
            try:
                comms.leave(clean)
            except Exception:  # noqa: BLE001 - exiting anyway
                log.debug("%s: leaving the communicators failed", name, exc_info=True)

        thread = threading.Thread(target=run, name="comm-leave", daemon=True)
        thread.start()
        thread.join(timeout_s)
        return not thread.is_alive()

    if attempt(cleanly):
        return True
    log.warning("%s: the communicators did not close within %.1f s; aborting them", name,
                timeout_s)
    if cleanly and attempt(False):
        return True
    log.warning("%s: exiting without leaving the communicators", name)
    return False
