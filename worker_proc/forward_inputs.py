"""ForwardInputs: the device tensors one model step reads, built from a ForwardBatch and the
shared-memory page table. Everything is computed with vectorized numpy (no per-token loop)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tessera.bus.messages import ForwardBatch


@dataclass
class ForwardInputs:
    """T tokens of B requests; S of them (the last token of each sampling request) get logits.

    A graph runner for decode keeps these in persistent buffers and copies a real batch into
    their first B rows (see `DecodeBuffers`).
    """

    input_ids: torch.Tensor  # int64 [T]; negative = "last token sampled for this row"
    token_rows: torch.Tensor  # int64 [T] page-table row of each token (resolves negatives)
    positions: torch.Tensor  # int64 [T]
    out_slots: torch.Tensor  # int64 [T] KV slots the new tokens' K/V are stored in
    req_to_token: torch.Tensor  # int32 [B, L] the requests' page-table rows, L >= max seq_len
    seq_lens: torch.Tensor  # int32 [B]
    extend_lens: torch.Tensor  # int32 [B]
    qo_indptr: torch.Tensor  # int32 [B + 1]
    logits_indices: torch.Tensor  # int64 [S]
    is_decode: bool
    has_last_sampled: bool = False  # some input id is negative (known on the host: no sync)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def build_forward_inputs(batch: ForwardBatch, req_to_token: np.ndarray,
                         device: torch.device) -> ForwardInputs:
    rows = np.asarray(batch.rows, dtype=np.int64)
    seq_lens = np.asarray(batch.seq_lens, dtype=np.int64)
    extend = np.asarray(batch.extend_lens, dtype=np.int64)
    num_tokens = int(extend.sum())
    if batch.input_ids.shape[0] != num_tokens:
        raise ValueError(f"ForwardBatch {batch.step}: {batch.input_ids.shape[0]} input ids for "
                         f"extend_lens summing to {num_tokens}")
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(extend, out=indptr[1:])
    starts = seq_lens - extend  # tokens already in KV before this step
    token_req = np.repeat(np.arange(len(rows)), extend)
    positions = starts[token_req] + np.arange(num_tokens) - indptr[token_req]
    token_rows = rows[token_req]
    out_slots = req_to_token[token_rows, positions].astype(np.int64)
    width = int(seq_lens.max()) if len(rows) else 0
    table = np.ascontiguousarray(req_to_token[rows, :width])
    sample = np.asarray(batch.sample, dtype=bool)
    logits_indices = (indptr[1:] - 1)[sample]
    input_ids = np.asarray(batch.input_ids, dtype=np.int64)

    def dev(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dtype,
                                                             non_blocking=True)

    return ForwardInputs(
        input_ids=dev(input_ids, torch.int64),
        token_rows=dev(token_rows, torch.int64),
        positions=dev(positions, torch.int64),
        out_slots=dev(out_slots, torch.int64),
        req_to_token=dev(table, torch.int32),
        seq_lens=dev(seq_lens, torch.int32),
        extend_lens=dev(extend, torch.int32),
        qo_indptr=dev(indptr, torch.int32),
        logits_indices=dev(logits_indices, torch.int64),
        is_decode=bool(batch.is_decode or (len(rows) > 0 and bool((extend == 1).all()))),
        has_last_sampled=bool((input_ids < 0).any()),
    )


class DecodeBuffers:
    """Persistent device tensors for decode batches of up to `max_bs` requests.

    A graph runner captures `ModelRunner.forward_decode` once per padded batch size on views of
    these buffers and, for each real batch, `load`s its inputs into them and replays. Padding
    rows are harmless: they read and write page 0 (reserved by KVArena for this), at position
    0, with a sequence length of 1.
    """

    def __init__(self, max_bs: int, max_context_len: int, device: torch.device) -> None:
        self.max_bs, self.width = max_bs, max_context_len

        def zeros(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids = zeros(max_bs)
        self.token_rows = zeros(max_bs)
        self.positions = zeros(max_bs)
        self.out_slots = zeros(max_bs)
        self.req_to_token = zeros(max_bs, max_context_len, dtype=torch.int32)
        self.seq_lens = zeros(max_bs, dtype=torch.int32)
        self.extend_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.qo_indptr = torch.arange(max_bs + 1, dtype=torch.int32, device=device)
        self.logits_indices = torch.arange(max_bs, dtype=torch.int64, device=device)

    def view(self, bs: int) -> ForwardInputs:
        """The inputs of a padded batch of `bs` rows (stable addresses for capture)."""
        return ForwardInputs(
            input_ids=self.input_ids[:bs], token_rows=self.token_rows[:bs],
            positions=self.positions[:bs], out_slots=self.out_slots[:bs],
            req_to_token=self.req_to_token[:bs], seq_lens=self.seq_lens[:bs],
            extend_lens=self.extend_lens[:bs], qo_indptr=self.qo_indptr[:bs + 1],
            logits_indices=self.logits_indices[:bs], is_decode=True)

    def load(self, inputs: ForwardInputs, bs: int) -> ForwardInputs:
        """Copy a real decode batch (B <= bs rows, every request sampling) into the buffers,
        pad rows B..bs, and return `view(bs)`. Logits rows B.. are padding: drop them."""
        b = inputs.num_tokens
        if not inputs.is_decode or b > bs or bs > self.max_bs:
            raise ValueError(f"decode buffers hold up to {self.max_bs} rows; got a batch of {b} "
                             f"padded to {bs} (decode: {inputs.is_decode})")
        if inputs.logits_indices.shape[0] != b:
            raise ValueError("a captured decode batch must sample every request")
        width = inputs.req_to_token.shape[1]
        for name in ("input_ids", "token_rows", "positions", "out_slots", "seq_lens"):
            dst = getattr(self, name)
            dst[:b].copy_(getattr(inputs, name), non_blocking=True)
            dst[b:bs].zero_()
        self.seq_lens[b:bs].fill_(1)
        # Columns past a row's seq_len are never read, so stale ones need no clearing.
        self.req_to_token[:b, :width].copy_(inputs.req_to_token, non_blocking=True)
        self.req_to_token[b:bs].zero_()
        return self.view(bs)
