"""Where a worker sits among --tp-size x --pp-size workers, and the communicators it needs.

    rank = stage * tp_size + tp_rank          (worker{rank}, one device each)

The ranks of one stage form its tensor-parallel group (all-reduces inside every layer); rank
r of stage s passes its activations to rank r of stage s + 1 (point-to-point on the world
communicator). The last stage's tp rank 0 samples the tokens every rank of its stage adopts and
answers the scheduler ("answers"), and takes the grammars of structured output.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from tessera.formats.parallel import StageLayers
from tessera.hal.platform import Communicator, Platform

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankLayout:
    rank: int
    tp_size: int = 1
    pp_size: int = 1

    def __post_init__(self) -> None:
        if self.tp_size < 1 or self.pp_size < 1:
            raise ValueError(f"--tp-size {self.tp_size} and --pp-size {self.pp_size} must be "
                             f"at least 1")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"--rank {self.rank} is outside --tp-size {self.tp_size} x "
                             f"--pp-size {self.pp_size}")

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def stage(self) -> int:
        return self.rank // self.tp_size

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def answers(self) -> bool:
        """This rank returns the sampled tokens (the last stage's tp rank 0)."""
        return self.stage == self.pp_size - 1 and self.tp_rank == 0

    def stage_layers(self, num_layers: int) -> StageLayers:
        return StageLayers.of(num_layers, self.pp_size, self.stage)

    def tp_groups(self) -> list[list[int]]:
        """The tensor-parallel group of every stage, in stage order."""
        return [[s * self.tp_size + t for t in range(self.tp_size)]
                for s in range(self.pp_size)]

    def peer(self, stage: int) -> int:
        """The rank holding this tp rank in `stage`."""
        return stage * self.tp_size + self.tp_rank


@dataclass
class Communicators:
    """`world`: every worker (pipeline sends, start-up agreement); `tp`: this stage's ranks
    (None when the stage has one rank)."""

    world: Communicator | None = None
    tp: Communicator | None = None

    @classmethod
    def create(cls, platform: Platform, layout: RankLayout, init_method: str,
               **extra: Any) -> Communicators:
        """`extra`: more keywords of `Platform.create_communicator` (worker_proc/dist_init.py)."""
        if layout.world_size == 1:
            return cls()
        world = platform.create_communicator(layout.rank, layout.world_size, init_method,
                                             **extra)
        if layout.pp_size == 1:
            return cls(world, world)
        tp = world.split(layout.tp_groups()) if layout.tp_size > 1 else None
        return cls(world, tp)

    def leave(self, cleanly: bool) -> None:
        """Tear the groups down: destroy when every step finished, abort otherwise (a peer
        may never join a collective still queued)."""
        if self.world is None:
            return
        if cleanly:
            self.world.destroy()
        else:
            self.world.abort()
