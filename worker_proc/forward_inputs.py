"""ForwardInputs: the device tensors one model step reads, built from a ForwardBatch and the
shared-memory page table. Everything is computed with vectorized numpy (no per-token loop)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tessera.bus.messages import ForwardBatch
from tessera.hal.platform import Platform


@dataclass
class ForwardInputs:
    """T tokens of B requests; S of them (the last token of each sampling request, the last
    d + 1 of one verifying d proposals) get logits.

    For a decode batch, `worker_proc/graph_decode.py` copies these into static buffers (the
    first B rows of a padded batch) and replays a captured graph.
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
    max_extend_len: int = 1  # max(extend_lens), known on the host: no device read per layer
    # A later pipeline stage starts from the previous stage's hidden states and residual
    # stream [T, hidden] instead of embedding input_ids (worker_proc/pipeline.py).
    hidden_in: torch.Tensor | None = None
    residual_in: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


# Every step's page table is padded to a width this divides (its extra columns are never
# read: each request reads only its seq_len entries), and so are the graphs' static tables.
# Compiled kernels specialize integer arguments on whether 16 divides them: with the width
# left at the step's longest sequence, the attention kernels' row stride took either case,
# and an H200 B2 run compiled kernels mid-run (1.5-2.3 s a step) for eager steps whose width
# the graphs had never had.
TABLE_WIDTH_MULTIPLE = 16


def table_width(longest: int) -> int:
    """The page-table width for a step whose longest sequence has this many tokens."""
    m = TABLE_WIDTH_MULTIPLE
    return max(m, -(-longest // m) * m)


def table_rows(req_to_token: np.ndarray, rows: np.ndarray, seq_lens: np.ndarray) -> np.ndarray:
    """The step's page table: these rows of the shared one, table_width(longest sequence)
    wide (zero columns beyond the shared table's own width); no columns for no rows."""
    if len(rows) == 0:
        return np.zeros((0, 0), dtype=req_to_token.dtype)
    width = table_width(int(seq_lens.max()))
    if width <= req_to_token.shape[1]:
        return np.ascontiguousarray(req_to_token[rows, :width])
    table = np.zeros((len(rows), width), dtype=req_to_token.dtype)
    table[:, :req_to_token.shape[1]] = req_to_token[rows]
    return table


def to_device(platform: Platform, a: np.ndarray, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    """A host array on the device without waiting for the device: the plugin queues the copy
    behind the work already there (step n may still be running)."""
    return platform.host_to_device(torch.from_numpy(np.ascontiguousarray(a)).to(dtype), device)


def _host(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(dtype)


def build_forward_inputs(batch: ForwardBatch, req_to_token: np.ndarray, platform: Platform,
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
    table = table_rows(req_to_token, rows, seq_lens)
    sample = np.asarray(batch.sample, dtype=bool)
    logits_indices = (indptr[1:] - 1)[sample]
    if batch.draft_lens.shape[0]:
        # A request verifying d proposals samples after each of its last d + 1 tokens.
        drafts = np.asarray(batch.draft_lens, dtype=np.int64)[sample]
        per = drafts + 1
        logits_indices = np.repeat(logits_indices - drafts, per) + (
            np.arange(int(per.sum())) - np.repeat(np.cumsum(per) - per, per))
    input_ids = np.asarray(batch.input_ids, dtype=np.int64)
    # One call for the nine arrays: the plugin may send them in one copy.
    (ids_d, rows_d, pos_d, slots_d, table_d, lens_d, extend_d, indptr_d, logits_d) = \
        platform.host_to_device_many([
            _host(input_ids, torch.int64), _host(token_rows, torch.int64),
            _host(positions, torch.int64), _host(out_slots, torch.int64),
            _host(table, torch.int32), _host(seq_lens, torch.int32),
            _host(extend, torch.int32), _host(indptr, torch.int32),
            _host(logits_indices, torch.int64)], device)
    return ForwardInputs(
        input_ids=ids_d,
        token_rows=rows_d,
        positions=pos_d,
        out_slots=slots_d,
        req_to_token=table_d,
        seq_lens=lens_d,
        extend_lens=extend_d,
        qo_indptr=indptr_d,
        logits_indices=logits_d,
        is_decode=bool(batch.is_decode or (len(rows) > 0 and bool((extend == 1).all()))),
        has_last_sampled=bool((input_ids < 0).any()),
        max_extend_len=int(extend.max()) if len(rows) else 0,
    )

