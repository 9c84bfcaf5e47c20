from __future__ import annotations

import pytest
import torch

from tessera.hal.local_comm import (
    LoopbackCommunicator,
    SingleRankCommunicator,
    make_local_communicator,
)


def test_choice_of_local_communicator() -> None:
    assert isinstance(make_local_communicator(0, 1, loopback=False), SingleRankCommunicator)
    assert isinstance(make_local_communicator(1, 2, loopback=True), LoopbackCommunicator)
    assert make_local_communicator(1, 2, loopback=False) is None  # real peers needed
    with pytest.raises(ValueError, match="rank 2 is not in a world of size 2"):
        make_local_communicator(2, 2, loopback=False)


def test_single_rank_has_no_peers() -> None:
    comm = SingleRankCommunicator()
    x = torch.ones(2)
    assert comm.all_reduce(x) is x  # no copy, no process group
    with pytest.raises(ValueError, match="no other rank"):
        comm.send(x, 1)


def test_loopback_semantics() -> None:
    comm = LoopbackCommunicator(rank=2, world_size=3)
    x = torch.arange(6.0).reshape(3, 2)
    assert torch.equal(comm.all_gather(x, dim=0), torch.cat([x, x, x]))
    assert torch.equal(comm.reduce_scatter(x, dim=0), x[2:3])
    with pytest.raises(ValueError, match="not divisible by world_size 3"):
        comm.reduce_scatter(torch.ones(4))
    with pytest.raises(RuntimeError, match="nothing was sent"):
        comm.recv(torch.empty(3, 2), 0)
    comm.send(x, 0)
    comm.send(x + 1, 0)
    x.zero_()  # what was sent is a copy
    buf = torch.empty(3, 2)
    assert comm.recv(buf, 0).tolist() == torch.arange(6.0).reshape(3, 2).tolist()
    assert comm.recv(buf, 0).tolist() == (torch.arange(6.0).reshape(3, 2) + 1).tolist()
