"""The torch.distributed collectives the gloo (cpu/) and NCCL (cuda/) communicators share.

A subclass checks `refuse_if_initialised()` first, does its backend's setup, calls
`_init_group(...)`, and implements all_gather, reduce_scatter (after `_check_divisible`) and
barrier its own way, on `self.group` (None: every rank of the world).

`split` makes one torch.distributed group per rank group (every rank creates every group, in
the same order, as torch.distributed requires) and returns this rank's as a communicator of
the same class; ranks in its send/recv are ranks within the group. Only the world communicator
owns the process groups: destroying it tears down the groups split from it.
"""

from __future__ import annotations

import copy
import logging
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from tessera.codes import MULTI_DEVICE_TIMEOUT, coded
from tessera.hal.platform import Communicator, Transfer

log = logging.getLogger(__name__)


class TorchDistCommunicator(Communicator):
    """One torch.distributed process group; all_reduce works in place and returns its argument."""

    group: Any = None  # a torch.distributed ProcessGroup; None: the default (world) group
    owns_group = True  # the world communicator; split ones leave teardown to it

    @staticmethod
    def refuse_if_initialised() -> None:
        if dist.is_initialized():
            raise RuntimeError("torch.distributed is already initialised in this process; "
                               "destroy the previous communicator first")

    def _init_group(self, backend: str, rank: int, world_size: int, init_method: str,
                    timeout_s: float, **kwargs: Any) -> None:
        try:
            dist.init_process_group(backend, init_method=init_method, rank=rank,
                                    world_size=world_size, timeout=timedelta(seconds=timeout_s),
                                    **kwargs)
        except Exception as exc:
            raise RuntimeError(
                f"rank {rank} of {world_size} could not join the {backend} group at "
                f"{init_method} within {timeout_s:g} s: {type(exc).__name__}: {exc}"
                + coded(MULTI_DEVICE_TIMEOUT)) from exc
        self.rank = rank
        self.world_size = world_size
        self.group = None
        self.owns_group = True

    def _check_divisible(self, tensor: torch.Tensor, dim: int) -> None:
        if tensor.shape[dim] % self.world_size:
            raise ValueError(f"reduce_scatter: size {tensor.shape[dim]} along dim {dim} is not "
                             f"divisible by world_size {self.world_size}")

    def _global(self, rank: int) -> int:
        """The world rank of this communicator's `rank` (torch.distributed's p2p ops take it)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is not in a group of {self.world_size}")
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def split(self, groups: list[list[int]]) -> Communicator:
        if sorted(r for g in groups for r in g) != list(range(self.world_size)):
            raise ValueError(f"split: groups {groups} must cover ranks 0..{self.world_size - 1} "
                             f"once each")
        mine: TorchDistCommunicator | None = None
        for ranks in (sorted(g) for g in groups):
            # Every rank creates every group (torch.distributed requires it), in order.
            group = dist.new_group([self._global(r) for r in ranks])
            if self.rank in ranks:
                mine = copy.copy(self)
                mine.group, mine.owns_group = group, False
                mine.rank, mine.world_size = ranks.index(self.rank), len(ranks)
                mine._on_split()
        assert mine is not None
        return mine

    def _on_split(self) -> None:
        """A subclass resets what belongs to the group it was copied from."""

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, group=self.group)
        return tensor

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        dist.send(tensor.contiguous(), self._global(dst), group=self.group)

    def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        dist.recv(tensor, self._global(src), group=self.group)
        return tensor

    # isend stays the blocking send: gloo reports a send's work complete only once it is
    # waited for. A device plugin whose work handles say so sends without blocking.

    def irecv(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
              src: int) -> Transfer:
        buf = torch.empty(shape, dtype=dtype, device=device)
        return DistTransfer(dist.irecv(buf, self._global(src), group=self.group), buf)

    def destroy(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()

    def abort(self) -> None:
        """ncclCommAbort and the like: no waiting on peers that will not come."""
        if not self.owns_group or not dist.is_initialized():
            return
        from torch.distributed import distributed_c10d as c10d

        abort = getattr(c10d, "_abort_process_group", None)
        if abort is None:
            self.destroy()
            return
        try:
            abort()
        except Exception:  # noqa: BLE001 - leaving anyway; the process exits next
            log.debug("abort of the process group failed", exc_info=True)


class DistTransfer(Transfer):
    """A torch.distributed work handle and the tensor it sends or fills (kept alive until the
    transfer is done)."""

    def __init__(self, work: Any, tensor: torch.Tensor) -> None:
        super().__init__(tensor)
        self.work = work

    def wait(self) -> torch.Tensor | None:
        self.work.wait()
        return self.tensor

    def done(self) -> bool:
        return bool(self.work.is_completed())
