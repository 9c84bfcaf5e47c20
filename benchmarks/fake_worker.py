"""A stand-in for the model worker, for measuring everything else: the host path.

`python -m tessera.benchmarks.fake_worker --run-dir DIR --step-ms 6` behaves like worker rank 0
seen from the scheduler: it sends WorkerReady (arena and vocabulary from the engine config and
the model's tokenizer) and answers every ForwardBatch with SampledTokens, in step order. Its
"device" takes `--step-ms` per step plus `--prefill-us-per-token` per prompt token, or with
`--cost-model tokens|flat` what the simulator's model of the H200 gives the step
(`sched_sim.CostModel`: by its tokens and its decodes' context), one step after the other,
while the process itself sleeps (no CPU), so the scheduler's overlap works as against a GPU
and every CPU second the engine spends is the host path's. Each result reports that time as
the step's own (`forward_ms`), as the real worker reports what it measured: the scheduler
learns its step costs from it. With `--padded` the model charges each step at the size the
cuda plugin's graphs would run it at (`CostModel.padded`), and the fake reports those sizes
in its WorkerReady, as the real worker reports its graphs' (the scheduler's
--fill-padded-steps reads them). With --trace-messages-dir it notes each step's launch
(composition, padded size) and readiness as the real worker does, for `step_trace`. Sampled
tokens are random ids above the special tokens (never EOS), so detokenization sees real text.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import deque
from typing import Any

import numpy as np

from tessera.bus import trace
from tessera.bus.channel import Inbox, Outbox
from tessera.bus.messages import ForwardBatch, Message, SampledTokens, WorkerReady
from tessera.bus.process import BusProcess, process_main
from tessera.bus.run_paths import RunPaths
from tessera.bus.stats import RoundTrips
from tessera.config import EngineConfig

log = logging.getLogger(__name__)

FIRST_ORDINARY_ID = 256  # below: special and byte tokens of most vocabularies
DEFAULT_SLOTS = 1 << 20


# The fake device's flags: the fake worker's own, and fake_engine's and `tessera bench
# host`'s, which pass them on (device_argv).
DEVICE_ARGS: dict[str, dict[str, Any]] = {
    "--step-ms": {"type": float, "default": 6.0, "help": "the fake device's time per step"},
    "--prefill-us-per-token": {"type": float, "default": 0.0,
                               "help": "and per prompt token of a step"},
    "--cost-model": {"choices": ["none", "tokens", "flat"], "default": "none",
                     "help": "instead: the simulator's model of the H200's step "
                             "(benchmarks/sched_sim.py CostModel)"},
    "--padded": {"action": "store_true",
                 "help": "with --cost-model: its steps at the cuda graphs' padded sizes, which "
                         "the fake reports to the scheduler as the real worker does "
                         "(--fill-padded-steps reads them)"},
}


def add_device_args(parser: argparse.ArgumentParser) -> None:
    for flag, kwargs in DEVICE_ARGS.items():
        parser.add_argument(flag, **kwargs)


def device_argv(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The fake worker's command-line flags for add_device_args' `args` (checked)."""
    if args.padded and args.cost_model == "none":
        parser.error("--padded pads the cost model's steps: give --cost-model")
    return ["--step-ms", str(args.step_ms), "--prefill-us-per-token",
            str(args.prefill_us_per_token), "--cost-model", args.cost_model,
            *(["--padded"] if args.padded else [])]


class FakeWorker(BusProcess):
    name = "worker0"

    def __init__(self, paths: RunPaths, config: EngineConfig, rank: int = 0,
                 step_ms: float = 6.0, prefill_us_per_token: float = 0.0,
                 cost_model: str = "none", padded: bool = False) -> None:
        super().__init__(paths, config)
        if rank != 0 or config.tp_size != 1:
            raise ValueError("the fake worker stands for one rank (--tp-size 1)")
        self.step_s = step_ms / 1e3
        self.prefill_s_per_token = prefill_us_per_token / 1e6
        self.cost: Any = None
        if cost_model != "none":
            from tessera.benchmarks.sched_sim import CostModel
            self.cost = CostModel(cost_model)
            if padded:
                self.cost = self.cost.padded()
        elif padded:
            raise ValueError("--padded pads the cost model's steps: give --cost-model")
        self.results: Outbox | None = None
        self.vocab_size = 0
        self.rng = np.random.default_rng(0)
        # (time the "device" finishes it, step, sampled count, its own ms), in step order
        self.queue: deque[tuple[float, int, int, float]] = deque()
        self.device_free_at = 0.0
        self.steps = 0
        self.round_trips = RoundTrips(config.steps_in_flight)  # as the real worker counts

    def setup(self) -> None:
        from tessera.formats.tokenizer import load_tokenizer

        cfg = self.config
        tokenizer = load_tokenizer(cfg.model, ids_only_ok=cfg.load_format == "dummy")
        self.vocab_size = tokenizer.vocab_size
        self.inbox = Inbox(self.paths.worker(0), name=self.name)
        self.results = Outbox(self.paths.scheduler_results, timeout_ms=cfg.send_timeout_ms)
        slots = cfg.max_total_tokens or DEFAULT_SLOTS
        self.results.send(WorkerReady(
            rank=0, world_size=1, num_slots=slots, page_size=cfg.page_size,
            max_context_len=cfg.context_length or 4096, vocab_size=self.vocab_size,
            eos_token_ids=list(tokenizer.eos_token_ids), device="fake",
            step_token_sizes=list(self.cost.step_sizes) if self.cost is not None else []))

    def handle(self, msgs: list[Message]) -> None:
        now = time.monotonic()
        for msg in msgs:
            if not isinstance(msg, ForwardBatch):
                continue
            self.round_trips.arrived(msg.step, time.perf_counter())
            trace.note_launch(self.name, msg)
            if trace.active():
                trace.note("launched", self.name, "ForwardBatch", step=msg.step,
                           padded=self.padded_tokens(msg))
            cost = self.step_cost_s(msg)
            self.device_free_at = max(now, self.device_free_at) + cost
            self.queue.append((self.device_free_at, msg.step, int(np.asarray(msg.sample).sum()),
                               cost * 1000.0))

    def step_cost_s(self, msg: ForwardBatch) -> float:
        """The fake device's time for this step."""
        extend = np.asarray(msg.extend_lens)
        if self.cost is not None:
            return float(self.cost.step_ms(np.asarray(msg.seq_lens), extend)) / 1000.0
        return self.step_s + self.prefill_s_per_token * float(extend[extend > 1].sum())

    def padded_tokens(self, msg: ForwardBatch) -> int:
        """The tokens the modeled device runs the step as (its graph's size, or its own)."""
        extend = np.asarray(msg.extend_lens)
        tokens = int(extend.sum())
        if self.cost is None:
            return tokens
        return int(self.cost.padded_size(tokens, prefills=bool((extend > 1).any())))

    def tick(self) -> None:
        now = time.monotonic()
        while self.queue and self.queue[0][0] <= now:
            _, step, sampled, own_ms = self.queue.popleft()
            tokens = self.rng.integers(FIRST_ORDINARY_ID, self.vocab_size, sampled,
                                       dtype=np.int32)
            assert self.results is not None
            trace.note("ready", self.name, "ForwardBatch", step=step)
            self.results.send(SampledTokens(step=step, token_ids=tokens, forward_ms=own_ms))
            self.round_trips.answered(step, time.perf_counter())
            self.steps += 1

    def wait_timeout(self) -> float:
        if not self.queue:
            return self.loop_timeout_s
        return max(0.0, self.queue[0][0] - time.monotonic())

    def stats(self) -> dict[str, float]:
        return {"steps": float(self.steps), **self.round_trips.stats()}

    def ready_info(self) -> dict[str, Any]:
        return {"rank": 0, "device": "fake", "model": self.config.model}

    def teardown(self) -> None:
        if self.results is not None:
            self.results.close()


if __name__ == "__main__":
    sys.exit(process_main(FakeWorker, extra_args={
        "--rank": {"type": int, "default": 0}, **DEVICE_ARGS}))
