"""Mixed and prefill steps through captured graphs: one graph per padded token count.

A step that is not all decodes launches about ten kernels per layer, and launching them one by
one costs the host more time than the device needs to run them, up to several hundred tokens
(docs/performance.md). So steps of up to --graph-max-tokens tokens replay a graph captured at
start-up for the smallest token bucket that holds them. The attention op's launch depends only
on the shapes (hal/ops.py, attention_extend), so one graph serves every mix of decodes and
prefill chunks that fits its bucket. The graph ends at the hidden states: the final norm and
the vocabulary matmul then run eagerly for the step's sampled rows only (a bucket's padded
rows would cost a 128k-wide matmul each). ModelRunner uses it as

    graphs = MixedGraphs(lambda inp: model.hidden(inp, kv), model.logits, runner,
                         max_tokens, max_requests, max_context_len, device)
    graphs.capture_all()                                     # at start-up, largest first
    if graphs.can_run(inputs): logits = graphs.run(inputs)   # else the eager forward

A bucket of T_k tokens holds up to B_k = min(T_k, max_requests) requests (each brings at
least one token). Before each replay the unused part is padding:
  tokens T .. T_k-1      id 0 at position 0, KV stored into slot 0 (page 0, reserved for
                         padding: KVArena), owned by no request (attention gives them zeros);
  requests B .. B_k-1    seq_len = extend_len = 0 and qo_indptr = T: no tokens, no KV read.
One set of static buffers sized for the largest bucket serves every bucket (views of its first
rows), and every graph copies its hidden states into one shared pair of buffers, so no graph
keeps memory of its own alive after it ends: the capture pool only needs the largest graph's
temporaries.

A later pipeline stage (`stage_input=(hidden_size, dtype)`) starts from the previous stage's
hidden states and residual instead of token ids: two more static buffers, filled before each
replay (padding rows keep whatever they held: their outputs are never read). A stage that is
not the last takes `run_hidden`'s (hidden, residual) and sends them on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch

from tessera.hal.platform import GraphRunner
from tessera.worker_proc.capture_plan import padded_batch_size, token_buckets
from tessera.worker_proc.forward_inputs import ForwardInputs, table_width

Hidden = tuple[torch.Tensor, torch.Tensor | None]


class MixedGraphs:
    def __init__(self, hidden: Callable[[ForwardInputs], Hidden],
                 logits: Callable[[torch.Tensor, torch.Tensor | None, ForwardInputs],
                                  torch.Tensor],
                 runner: GraphRunner, max_tokens: int, max_requests: int, max_context_len: int,
                 device: torch.device, buckets: Sequence[int] | None = None,
                 stage_input: tuple[int, torch.dtype] | None = None) -> None:
        self.hidden = hidden
        self.logits = logits
        self.runner = runner
        self.buckets = sorted(buckets) if buckets is not None else token_buckets(max_tokens)
        self.last_bucket = 0  # the bucket of the last replay
        self.max_requests = max_requests
        n = self.buckets[-1] if self.buckets else 0
        r = self.requests_for(n)

        def zeros(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids = zeros(n, dtype=torch.int64)
        self.token_rows = zeros(n, dtype=torch.int64)  # read by no captured op
        self.positions = zeros(n, dtype=torch.int64)
        self.out_slots = zeros(n, dtype=torch.int64)
        self.req_to_token = zeros(r, table_width(max_context_len), dtype=torch.int32)
        self.seq_lens = zeros(r, dtype=torch.int32)
        self.extend_lens = zeros(r, dtype=torch.int32)
        self.qo_indptr = zeros(r + 1, dtype=torch.int32)
        self.logits_indices = zeros(r, dtype=torch.int64)  # read by no captured op
        self.hidden_in: torch.Tensor | None = None
        self.residual_in: torch.Tensor | None = None
        if stage_input is not None:
            width, dtype = stage_input
            self.hidden_in = torch.zeros((n, width), dtype=dtype, device=device)
            self.residual_in = torch.zeros((n, width), dtype=dtype, device=device)
        self.h: torch.Tensor | None = None  # [largest bucket, hidden], written by every graph
        self.residual: torch.Tensor | None = None
        self.captured: set[int] = set()

    def requests_for(self, tokens: int) -> int:
        """Requests (and sampled rows) a bucket of `tokens` holds."""
        return min(tokens, self.max_requests)

    def bucket_for(self, tokens: int) -> int | None:
        return padded_batch_size(tokens, self.buckets)

    def _static(self, tokens: int) -> ForwardInputs:
        reqs = self.requests_for(tokens)
        return ForwardInputs(
            input_ids=self.input_ids[:tokens], token_rows=self.token_rows[:tokens],
            positions=self.positions[:tokens], out_slots=self.out_slots[:tokens],
            req_to_token=self.req_to_token[:reqs], seq_lens=self.seq_lens[:reqs],
            extend_lens=self.extend_lens[:reqs], qo_indptr=self.qo_indptr[:reqs + 1],
            logits_indices=self.logits_indices[:reqs], is_decode=False,
            max_extend_len=tokens,  # an upper bound, as the op allows for captured steps
            hidden_in=None if self.hidden_in is None else self.hidden_in[:tokens],
            residual_in=None if self.residual_in is None else self.residual_in[:tokens])

    def capture_all(self) -> None:
        """Capture every bucket, the largest first (the smaller ones' temporaries then fit in
        the pool it reserved). The buffers hold padding only meanwhile: no request, no KV
        read, every token stored into slot 0."""
        if not self.buckets:
            return
        with torch.inference_mode():
            h, residual = self.hidden(self._static(self.buckets[0]))  # widths and dtypes
            n = self.buckets[-1]
            self.h = torch.empty((n, *h.shape[1:]), dtype=h.dtype, device=h.device)
            if residual is not None:
                self.residual = torch.empty((n, *residual.shape[1:]), dtype=residual.dtype,
                                            device=residual.device)
            for tokens in reversed(self.buckets):
                self.runner.capture(("mixed", tokens), functools.partial(self._step, tokens))
                self.captured.add(tokens)

    def _step(self, tokens: int) -> torch.Tensor:
        """The captured work: the hidden states of the bucket into the shared buffers (its
        output, rewritten by every replay, is the view of them it wrote)."""
        assert self.h is not None
        h, residual = self.hidden(self._static(tokens))
        self.h[:tokens].copy_(h)
        if self.residual is not None:
            assert residual is not None
            self.residual[:tokens].copy_(residual)
        return self.h[:tokens]

    def can_run(self, inputs: ForwardInputs) -> bool:
        tokens = inputs.num_tokens
        bucket = self.bucket_for(tokens)
        if tokens == 0 or bucket is None or bucket not in self.captured:
            return False
        return (0 < int(inputs.seq_lens.shape[0]) <= self.requests_for(bucket)
                and int(inputs.req_to_token.shape[1]) <= int(self.req_to_token.shape[1]))

    def run(self, inputs: ForwardInputs) -> torch.Tensor:
        """float32 logits [S, V] of the step's sampled rows (inputs.logits_indices): the
        bucket's graph, then the final norm and LM head on those rows."""
        h, residual = self.run_hidden(inputs)
        return self.logits(h, residual, inputs)

    def run_hidden(self, inputs: ForwardInputs) -> Hidden:
        """The bucket's graph: the last layer's hidden states and residual of the step's
        tokens, views of the shared buffers (valid until the next replay)."""
        if not self.can_run(inputs):
            raise ValueError(f"no graph for a step of {inputs.num_tokens} tokens and "
                             f"{int(inputs.seq_lens.shape[0])} requests (buckets: "
                             f"{sorted(self.captured)})")
        tokens, batch = inputs.num_tokens, int(inputs.seq_lens.shape[0])
        bucket = self.bucket_for(tokens)
        assert bucket is not None
        reqs = self.requests_for(bucket)
        width = int(inputs.req_to_token.shape[1])
        self.input_ids[:tokens].copy_(inputs.input_ids)
        self.positions[:tokens].copy_(inputs.positions)
        self.out_slots[:tokens].copy_(inputs.out_slots)
        self.req_to_token[:batch, :width].copy_(inputs.req_to_token)
        self.seq_lens[:batch].copy_(inputs.seq_lens)
        self.extend_lens[:batch].copy_(inputs.extend_lens)
        self.qo_indptr[:batch + 1].copy_(inputs.qo_indptr)
        if self.hidden_in is not None and self.residual_in is not None:
            if inputs.hidden_in is None or inputs.residual_in is None:
                raise ValueError("a later pipeline stage's step needs the previous stage's "
                                 "hidden states")
            self.hidden_in[:tokens].copy_(inputs.hidden_in)
            self.residual_in[:tokens].copy_(inputs.residual_in)
        if bucket > tokens:
            for buf in (self.input_ids, self.positions, self.out_slots):
                buf[tokens:bucket].zero_()
        if reqs > batch:
            self.seq_lens[batch:reqs].zero_()
            self.extend_lens[batch:reqs].zero_()
            self.qo_indptr[batch + 1:reqs + 1].fill_(tokens)
        self.runner.replay(("mixed", bucket))
        self.last_bucket = bucket
        assert self.h is not None
        residual = self.residual[:tokens] if self.residual is not None else None
        return self.h[:tokens], residual
