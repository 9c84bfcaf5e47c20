"""Where the worker ranks of one engine meet (torch.distributed's init method) and on which
device each one's collectives run.

One host: a file in the private run directory. Several hosts (`--nnodes`): node 0's
`--dist-init-addr` HOST:PORT over tcp, where rank 0 (on node 0) listens. A rank's device is
`EngineConfig.device_index(rank)`; the communicator is told only when that is not `rank`, so a
plugin that predates the argument still works on one host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tessera.bus.run_paths import RunPaths
from tessera.config import EngineConfig


@dataclass(frozen=True)
class CommunicatorArgs:
    init_method: str
    extra: dict[str, Any] = field(default_factory=dict)


def communicator_args(config: EngineConfig, rank: int, paths: RunPaths) -> CommunicatorArgs:
    if config.nnodes > 1:
        if not config.dist_init_addr:
            raise ValueError("--nnodes > 1 needs --dist-init-addr HOST:PORT of node 0")
        init = f"tcp://{config.dist_init_addr}"
    else:
        init = f"file://{paths.tp_rendezvous}"
    device = config.device_index(rank)
    return CommunicatorArgs(init, {} if device == rank else {"device_index": device})
