"""Decode through captured graphs: static input buffers, one graph per padded batch size,
through the plugin's `GraphRunner` (hal/platform.py). ModelRunner uses it as

    graphs = DecodeGraphs(lambda inp: self.model(inp, self.kv), runner, max_bs,
                          max_context_len, device)       # after the KV arena exists
    graphs.capture_all()                                    # at start-up, largest size first
    ...
    if graphs.can_run(inputs): logits = graphs.run(inputs)  # else the eager forward

One set of static buffers sized for the largest batch serves every size (each graph reads
views of its first rows), so every address is fixed at capture. Every graph also copies its
logits into one shared static buffer, so no graph keeps memory of its own alive after it
ends: the shared pool then only needs the largest graph's temporaries. Padding rows decode a
dummy token into slot 0 (page 0, reserved for padding: KVArena) with seq_len 1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch

from tessera.hal.platform import GraphRunner
from tessera.worker_proc.capture_plan import capture_batch_sizes, padded_batch_size
from tessera.worker_proc.forward_inputs import ForwardInputs, table_width


class DecodeGraphs:
    def __init__(self, forward: Callable[[ForwardInputs], torch.Tensor], runner: GraphRunner,
                 max_bs: int, max_context_len: int, device: torch.device,
                 sizes: Sequence[int] | None = None) -> None:
        self.forward = forward
        self.runner = runner
        self.sizes = sorted(sizes) if sizes is not None else capture_batch_sizes(max_bs)
        self.max_bs = self.sizes[-1] if self.sizes else 0
        self.last_bucket = 0  # the padded batch of the last replay
        n = self.max_bs

        def zeros(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids = zeros(n, dtype=torch.int64)
        self.token_rows = zeros(n, dtype=torch.int64)
        self.positions = zeros(n, dtype=torch.int64)
        self.out_slots = zeros(n, dtype=torch.int64)
        self.req_to_token = zeros(n, table_width(max_context_len), dtype=torch.int32)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.extend_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.qo_indptr = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.logits_indices = torch.arange(n, dtype=torch.int64, device=device)
        self.logits: torch.Tensor | None = None  # [max_bs, V], allocated by capture_all
        self.outputs: dict[int, torch.Tensor] = {}

    def _static(self, bs: int) -> ForwardInputs:
        return ForwardInputs(
            input_ids=self.input_ids[:bs], token_rows=self.token_rows[:bs],
            positions=self.positions[:bs], out_slots=self.out_slots[:bs],
            req_to_token=self.req_to_token[:bs], seq_lens=self.seq_lens[:bs],
            extend_lens=self.extend_lens[:bs], qo_indptr=self.qo_indptr[:bs + 1],
            logits_indices=self.logits_indices[:bs], is_decode=True)

    def capture_all(self) -> None:
        if not self.sizes:
            return
        with torch.inference_mode():
            probe = self.forward(self._static(1))  # learns the logits' width and dtype
            self.logits = torch.empty((self.max_bs, probe.shape[-1]), dtype=probe.dtype,
                                      device=probe.device)
            # Largest first: the smaller graphs' temporaries then fit in the pool it reserved.
            for bs in reversed(self.sizes):
                self.outputs[bs] = self.runner.capture(bs, functools.partial(self._step, bs))

    def _step(self, bs: int) -> torch.Tensor:
        assert self.logits is not None
        out = self.logits[:bs]
        out.copy_(self.forward(self._static(bs)))
        return out

    def padded_size(self, batch: int) -> int | None:
        return padded_batch_size(batch, self.sizes)

    def can_run(self, inputs: ForwardInputs) -> bool:
        batch = int(inputs.seq_lens.shape[0])
        bs = self.padded_size(batch)
        return (inputs.is_decode and batch > 0 and bs is not None and bs in self.outputs
                and inputs.num_tokens == batch
                and int(inputs.logits_indices.shape[0]) == batch
                and int(inputs.req_to_token.shape[1]) <= int(self.req_to_token.shape[1]))

    def run(self, inputs: ForwardInputs) -> torch.Tensor:
        """Logits [B, V] of a decode batch of B <= max_bs rows (every row sampled): a view of
        the shared static buffer, valid until the next run()."""
        batch = int(inputs.seq_lens.shape[0])
        bs = self.padded_size(batch)
        if bs is None or bs not in self.outputs:
            raise ValueError(f"no graph for a decode batch of {batch} (captured: {self.sizes})")
        width = int(inputs.req_to_token.shape[1])
        self.input_ids[:batch].copy_(inputs.input_ids)
        self.token_rows[:batch].copy_(inputs.token_rows)
        self.positions[:batch].copy_(inputs.positions)
        self.out_slots[:batch].copy_(inputs.out_slots)
        self.req_to_token[:batch, :width].copy_(inputs.req_to_token)
        self.seq_lens[:batch].copy_(inputs.seq_lens)
        if bs > batch:  # padding rows: one token at position 0 into slot 0, seq_len 1
            for buf in (self.input_ids, self.positions, self.out_slots):
                buf[batch:bs].zero_()
            self.req_to_token[batch:bs, 0].zero_()
            self.seq_lens[batch:bs].fill_(1)
        self.runner.replay(bs)
        self.last_bucket = bs
        return self.outputs[bs][:batch]
