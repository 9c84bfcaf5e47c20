"""NCCL collectives through torch.distributed, usable inside captured CUDA graphs.

Collectives are issued synchronously (async_op=False) on the current stream, which is what
CUDA graph capture records; NCCL >= 2.9.6 supports capture. `world_size == 1` and loopback
never reach this class (hal/local_comm.py). After `configure`, small all-reduces of the serving
dtype take the one-shot path over peer memory (hal/cuda/one_shot.py) when every rank of the
group can; everything else, and every all-reduce where they cannot, stays NCCL.
"""

from __future__ import annotations

import logging
import socket
import zlib

import torch
import torch.distributed as dist

from tessera.hal.cuda.one_shot import (
    OneShotAllReduce,
    disable_multicast,
    local_problem,
    probe_matches_nccl,
)
from tessera.hal.dist_comm import DistTransfer, TorchDistCommunicator
from tessera.hal.platform import Transfer

log = logging.getLogger(__name__)


class NcclCommunicator(TorchDistCommunicator):
    """all_reduce works in place and returns its argument; the others return new tensors."""

    def __init__(self, rank: int, world_size: int, init_method: str,
                 timeout_s: float = 300.0, device_index: int | None = None) -> None:
        self.refuse_if_initialised()
        count = torch.cuda.device_count()
        if count == 0:
            raise RuntimeError("NCCL communicator: no CUDA device is visible")
        disable_multicast()
        self.device = torch.device("cuda", (rank if device_index is None else device_index)
                                   % count)
        torch.cuda.set_device(self.device)
        self._one_shot: OneShotAllReduce | None = None
        self._side: torch.cuda.Stream | None = None  # the point-to-point transfers' stream
        self._init_group("nccl", rank, world_size, init_method, timeout_s, device_id=self.device)

    def _on_split(self) -> None:
        self._one_shot = None

    def _agree(self, ok: bool) -> bool:
        """Whether every rank of the group says ok (a collective)."""
        failures = torch.tensor([0 if ok else 1], dtype=torch.int32, device=self.device)
        dist.all_reduce(failures, group=self.group)
        return int(failures.item()) == 0

    def _group_devices(self) -> list[int] | None:
        """The device index of every rank of the group (a collective), or None when the group
        spans hosts (peer memory is one host's)."""
        host = zlib.crc32(socket.gethostname().encode())
        mine = torch.tensor([[host, self.device.index or 0]], dtype=torch.int64,
                            device=self.device)
        parts = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(parts, mine, group=self.group)
        rows = torch.cat(parts).tolist()
        if len({h for h, _ in rows}) > 1:
            return None
        return [int(d) for _, d in rows]

    def configure(self, *, one_shot_max_bytes: int, dtype: torch.dtype) -> str:
        """Set up the one-shot all-reduce for `dtype` up to `one_shot_max_bytes`, if every
        rank can and a probe agrees with NCCL; otherwise NCCL for everything. Collective:
        every rank of the group calls it, and every rank ends with the same choice."""
        self._one_shot = None
        if one_shot_max_bytes <= 0:
            return "NCCL (one-shot all-reduce off)"
        devices = self._group_devices()
        problem = "the group spans hosts" if devices is None else \
            local_problem(dtype, devices, self.device)
        if not self._agree(problem is None):
            return f"NCCL ({problem or 'a peer cannot use the one-shot all-reduce'})"
        one_shot: OneShotAllReduce | None = None
        try:
            one_shot = OneShotAllReduce.create(self.group, one_shot_max_bytes, dtype,
                                               self.device)
        except Exception as exc:  # noqa: BLE001 - NCCL still works: say why, carry on
            problem = f"symmetric memory set-up failed: {type(exc).__name__}: {exc}"
        if not self._agree(one_shot is not None):
            return f"NCCL ({problem or 'a peer could not set up symmetric memory'})"
        assert one_shot is not None
        try:
            matches = probe_matches_nccl(one_shot, self.group, self.rank, self.device)
        except Exception as exc:  # noqa: BLE001
            matches, problem = False, f"the probe failed: {type(exc).__name__}: {exc}"
        if not self._agree(matches):
            return f"NCCL ({problem or 'the one-shot probe differed from NCCL on some rank'})"
        self._one_shot = one_shot
        kib = one_shot.max_numel * one_shot.buffer.element_size() // 1024
        return (f"one-shot all-reduce over peer memory up to {kib} KiB of {dtype} "
                f"({'fused copy' if one_shot.fused_copy else 'copy + kernel'}), NCCL beyond")

    @property
    def one_shot_max_bytes(self) -> int:
        """Largest all-reduce that takes the one-shot path (0: none)."""
        s = self._one_shot
        return 0 if s is None else s.max_numel * s.buffer.element_size()

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        one_shot = self._one_shot
        if one_shot is not None and one_shot.fits(tensor):
            return one_shot(tensor)
        dist.all_reduce(tensor, group=self.group)
        return tensor

    # Point-to-point transfers of a pipeline run on a stream of their own. torch queues an
    # NCCL op behind the current stream's work: a receive posted from the compute stream waits
    # for every step queued before it, and a send there holds the compute stream until the
    # peer has posted its receive, so the stages take turns. From a side stream, a receive is
    # posted at once (its buffer allocated there, so no memory the compute stream may still
    # use) and the compute stream waits only for its data; a send waits only for its input.

    def _p2p_stream(self) -> torch.cuda.Stream:
        stream = self._side
        if stream is None:
            stream = self._side = torch.cuda.Stream(self.device)
        return stream

    def isend(self, tensor: torch.Tensor, dst: int) -> Transfer:
        side = self._p2p_stream()
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            tensor = tensor.contiguous()
            work = dist.isend(tensor, self._global(dst), group=self.group)
        return DistTransfer(work, tensor)

    def irecv(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
              src: int) -> Transfer:
        with torch.cuda.stream(self._p2p_stream()):
            buf = torch.empty(shape, dtype=dtype, device=device)
            work = dist.irecv(buf, self._global(src), group=self.group)
        return _StreamRecv(work, buf)

    def nccl_all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The NCCL path whatever the size (to check the one-shot path against it)."""
        dist.all_reduce(tensor, group=self.group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        tensor = tensor.contiguous()
        out = torch.empty((self.world_size * tensor.shape[0], *tensor.shape[1:]),
                          dtype=tensor.dtype, device=tensor.device)
        one_shot = self._one_shot
        if one_shot is not None and one_shot.fits(out):
            # Small gathers (the LM head's logits of a decode step): each rank's part at its
            # place in zeros, summed by the one-shot kernel. x + 0 is x exactly, so this is
            # the gather, at the one-shot's latency instead of NCCL's.
            out.zero_()
            out[self.rank * tensor.shape[0]:(self.rank + 1) * tensor.shape[0]].copy_(tensor)
            one_shot(out)
        else:
            dist.all_gather_into_tensor(out, tensor, group=self.group)
        if dim == 0:
            return out
        return torch.cat(out.chunk(self.world_size, dim=0), dim=dim)

    def nccl_all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """NCCL's gather along dim 0 whatever the size (to check the one-shot path)."""
        tensor = tensor.contiguous()
        out = torch.empty((self.world_size * tensor.shape[0], *tensor.shape[1:]),
                          dtype=tensor.dtype, device=tensor.device)
        dist.all_gather_into_tensor(out, tensor, group=self.group)
        return out

    def reduce_scatter(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        self._check_divisible(tensor, dim)
        # NCCL scatters along dim 0; move `dim` there and back.
        src = tensor.movedim(dim, 0).contiguous()
        out = torch.empty((src.shape[0] // self.world_size, *src.shape[1:]), dtype=src.dtype,
                          device=src.device)
        dist.reduce_scatter_tensor(out, src, group=self.group)
        return out.movedim(0, dim).contiguous()

    def barrier(self) -> None:
        dist.barrier(group=self.group, device_ids=[self.device.index])

    def destroy(self) -> None:
        self._one_shot = None  # the symmetric buffer goes before the group it was made for
        super().destroy()


class _StreamRecv(DistTransfer):
    """A receive posted on the side stream: wait() makes the current stream wait for its data
    (no host wait), and the buffer is not reused before the current stream's work on it."""

    def wait(self) -> torch.Tensor | None:
        self.work.wait()
        assert self.tensor is not None
        self.tensor.record_stream(torch.cuda.current_stream(self.tensor.device))
        return self.tensor
