"""Communicators that need no peers: the `world_size == 1` short-cut and loopback mode.

Any plugin can return these from `create_communicator`; `make_local_communicator` picks one.

Loopback ("every rank talks to itself") lets one process run a tensor-parallel code path at
its real shapes without peers, for debugging. It behaves as if all `world_size` ranks held
this rank's tensor and each reduction had a single contributor:
    all_reduce(x)          -> x (unchanged; the sum over one contributor)
    all_gather(x, dim)     -> x tiled world_size times along dim
    reduce_scatter(x, dim) -> this rank's chunk of x along dim (x.shape[dim] / world_size)
    send(x, dst)           -> queued under dst;  recv(buf, src) -> pops what was sent to src
                              (so a rank's send to a peer comes back as its recv from it)
    barrier()              -> no-op
"""

from __future__ import annotations

from collections import defaultdict, deque

import torch

from tessera.hal.platform import Communicator


class SingleRankCommunicator(Communicator):
    """world_size == 1: every collective is the identity; no process group is created."""

    def __init__(self) -> None:
        self.rank = 0
        self.world_size = 1

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return tensor

    def reduce_scatter(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return tensor

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        raise ValueError(f"send to rank {dst} with world_size 1: there is no other rank")

    def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        raise ValueError(f"recv from rank {src} with world_size 1: there is no other rank")

    def barrier(self) -> None:
        pass

    def destroy(self) -> None:
        pass


class LoopbackCommunicator(Communicator):
    """Pretends to be rank `rank` of `world_size`, every peer being itself (see module doc)."""

    def __init__(self, rank: int, world_size: int) -> None:
        _check_rank(rank, world_size)
        self.rank = rank
        self.world_size = world_size
        self._mailbox: dict[int, deque[torch.Tensor]] = defaultdict(deque)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return torch.cat([tensor] * self.world_size, dim=dim)

    def reduce_scatter(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return _my_chunk(tensor, dim, self.rank, self.world_size)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        _check_rank(dst, self.world_size)
        self._mailbox[dst].append(tensor.clone())

    def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        _check_rank(src, self.world_size)
        if not self._mailbox[src]:
            raise RuntimeError(f"loopback recv from rank {src}: nothing was sent to it first "
                               f"(in loopback mode a rank receives what it sent)")
        tensor.copy_(self._mailbox[src].popleft())
        return tensor

    def barrier(self) -> None:
        pass

    def split(self, groups: list[list[int]]) -> Communicator:
        """This rank's group, every peer of it still being this process."""
        if sorted(r for g in groups for r in g) != list(range(self.world_size)):
            raise ValueError(f"split: groups {groups} must cover ranks 0..{self.world_size - 1} "
                             f"once each")
        (mine,) = [g for g in groups if self.rank in g]
        return LoopbackCommunicator(sorted(mine).index(self.rank), len(mine))

    def destroy(self) -> None:
        self._mailbox.clear()


def make_local_communicator(rank: int, world_size: int, loopback: bool) -> Communicator | None:
    """The peerless communicator for these arguments, or None if real peers are needed."""
    if world_size == 1 and not loopback:
        return SingleRankCommunicator()
    if loopback:
        return LoopbackCommunicator(rank, world_size)
    _check_rank(rank, world_size)
    return None


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")


def _my_chunk(tensor: torch.Tensor, dim: int, rank: int, world_size: int) -> torch.Tensor:
    if tensor.shape[dim] % world_size:
        raise ValueError(f"reduce_scatter: size {tensor.shape[dim]} along dim {dim} is not "
                         f"divisible by world_size {world_size}")
    return tensor.chunk(world_size, dim=dim)[rank].contiguous()
