"""One worker of test_pipeline_parallel: `python -m tests.worker_proc.pp_rank MODEL RANK TP PP
INIT OUT PROMPTS_JSON [graphs]`. Runs a ModelRunner for its (stage, tp rank) of tp x pp workers
under the test's MiniScheduler and writes the greedy tokens as JSON to OUT. With `graphs`, the
platform declares graph capture with the stand-in runner of test_graph_decode (it reruns the
captured callable on the static buffers), so every step goes through the stage's MixedGraphs
as on a GPU: a later stage's graphs start from the received hidden states.

Only the last stage samples; here every worker learns the tokens through the world group (the
answering rank contributes them, the others zeros), as the real scheduler would tell them by
sending the next step's input ids."""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

from tessera.bus.messages import ForwardBatch, SampledTokens
from tessera.config import EngineConfig
from tessera.hal.registry import load_platform
from tessera.worker_proc.model_runner import ModelRunner
from tessera.worker_proc.parallel import Communicators, RankLayout
from tests.worker_proc.driver import MiniScheduler

REPLAYS = [0]  # steps this worker ran from a captured graph


class SharedTokens:
    """A runner whose step() returns the answering rank's tokens on every worker."""

    def __init__(self, runner: ModelRunner, comms: Communicators) -> None:
        self.runner, self.comms = runner, comms

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def step(self, batch: ForwardBatch, req_to_token: np.ndarray) -> SampledTokens:
        import torch

        result = self.runner.step(batch, req_to_token)
        assert result.error is None, result.error
        n = int(np.asarray(batch.sample).sum())
        mine = torch.zeros(n, dtype=torch.int64)
        if self.runner.answers:
            assert result.token_ids.shape[0] == n
            mine += torch.from_numpy(result.token_ids.astype(np.int64))
        assert self.comms.world is not None
        tokens = self.comms.world.all_reduce(mine)
        return SampledTokens(step=batch.step, token_ids=tokens.numpy().astype(np.int32))


def capturing_platform() -> Any:
    """The cpu plugin, declaring graph capture, with a stand-in graph runner."""
    import dataclasses

    from tessera.hal.cpu import CpuPlatform
    from tests.worker_proc.test_graph_decode import RerunRunner

    class CapturingCpu(CpuPlatform):
        capabilities = dataclasses.replace(CpuPlatform.capabilities, graph_capture=True,
                                           max_capture_batch=8)

        def create_graph_runner(self) -> RerunRunner:
            return RerunRunner()

    return CapturingCpu()


def main(model: str, rank: int, tp: int, pp: int, init: str, out: str,
         prompts_json: str, graphs: bool = False) -> None:
    import torch

    torch.set_num_threads(1)
    prompts = json.loads(prompts_json)
    config = EngineConfig(model=model, hal="cpu", dtype="float32", page_size=4,
                          max_running_requests=16, context_length=128, max_total_tokens=1024,
                          tp_size=tp, pp_size=pp, graph_max_tokens=64)
    platform = capturing_platform() if graphs else load_platform("cpu")
    comms = Communicators.create(platform, RankLayout(rank, tp, pp), init)
    runner = ModelRunner(config, rank, platform, comms.tp, world=comms.world)
    if runner.mixed_graphs is not None:
        run_hidden = runner.mixed_graphs.run_hidden

        def counted(inputs: Any) -> Any:
            REPLAYS[0] += 1
            return run_hidden(inputs)

        runner.mixed_graphs.run_hidden = counted
    sched = MiniScheduler(SharedTokens(runner, comms), chunk_size=12, refer_back=False)
    greedy = sched.generate(prompts, 12)
    mixed = runner.mixed_graphs
    with open(out, "w") as f:
        json.dump({"greedy": [r.out for r in greedy], "kv_slots": runner.kv_plan.num_slots,
                   "layers": [runner.stage.first, runner.stage.end],
                   "graph_buckets": sorted(mixed.captured) if mixed is not None else [],
                   "graph_replays": REPLAYS[0]}, f)
    comms.leave(cleanly=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], int(a[1]), int(a[2]), int(a[3]), a[4], a[5], a[6],
         len(a) > 7 and a[7] == "graphs")
