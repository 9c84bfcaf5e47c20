"""Activations between pipeline stages: the hidden states and the residual stream of every
token of a step, [2, T, hidden] in one message, from rank r of stage s to rank r of stage s + 1
through the world communicator's point-to-point ops.

Every stage runs the scheduler's steps in the order they were sent, so stage s + 1's n-th
receive matches stage s's n-th send; the token count T comes from the step's ForwardBatch,
which every worker gets. The transfers are the communicator's isend / irecv: a receive is
posted when its step is launched, ahead of the steps this stage has queued before it, and only
the step's own work waits for the data; a send waits for the step's output but holds nothing
after it, so a stage goes on to its next step while the next stage is still busy (the sent
tensors are kept until their transfers are done).
"""

from __future__ import annotations

import torch

from tessera.hal.platform import Communicator, Transfer
from tessera.worker_proc.parallel import RankLayout


class PipelineLink:
    def __init__(self, world: Communicator, layout: RankLayout, hidden_size: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.world = world
        self.layout = layout
        self.hidden_size = hidden_size
        self.dtype, self.device = dtype, device
        stage = layout.stage
        self.prev = layout.peer(stage - 1) if stage > 0 else None
        self.next = layout.peer(stage + 1) if stage < layout.pp_size - 1 else None
        self.sending: list[Transfer] = []  # sends not yet known to be done

    def receive(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The previous stage's (hidden states, residual) of this step's tokens."""
        if self.prev is None:
            raise RuntimeError("the first pipeline stage receives nothing")
        buf = self.world.irecv((2, num_tokens, self.hidden_size), self.dtype, self.device,
                               self.prev).wait()
        assert buf is not None
        return buf[0], buf[1]

    def send(self, h: torch.Tensor, residual: torch.Tensor | None) -> None:
        """This stage's output to the next one (a stage always ends on a decoder layer,
        which returns a residual)."""
        if self.next is None:
            raise RuntimeError("the last pipeline stage sends nothing")
        if residual is None:
            raise ValueError("a pipeline stage must end with a residual stream")
        self.sending = [t for t in self.sending if not t.done()]
        self.sending.append(self.world.isend(torch.stack((h, residual)), self.next))
