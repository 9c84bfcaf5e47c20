"""Row-indexed state of running sequences, as preallocated numpy arrays.

Row r of every array belongs to the sequence bound to page-table row r, so a decode step over
B sequences is a handful of fancy-indexing operations instead of B Python calls.

Per row (positions count tokens from 0):
  tokens[r, :n_known]   known tokens: prompt, then outputs received
  pending[r]            steps in flight that sample for it (overlap: 1; 2 while a verify is
                        chained after another one); their tokens are not in tokens yet
  kv_len[r]             tokens whose KV is written or scheduled to be; kv_done[r]: written
  pages[r, :n_pages]    KV pages, n_pages == ceil(kv_len / page_size) (kept by `grow`)
  tree_pages[r]         the first tree_pages pages belong to the radix cache (locked path);
                        the rest are the sequence's own
  drafts[r]             proposals its steps in flight verify (speculative decoding): their
                        KV slots count in kv_len until the result says how many were kept;
                        they are also in tokens[r, n_known:kv_len] (beside a guess of each
                        token in flight), where a chained verify's lookup finds them
A row is *decode-ready* when kv_len == n_known + pending - 1 (only the last token lacks KV;
never while a verify of it is in flight, whose proposals count in kv_len),
*prefilling* when kv_len is smaller, and *done scheduling* when n_known + pending reaches
max_total (its last result is still to come).
"""

from __future__ import annotations

import numpy as np

from tessera.bus.messages import ForwardBatch, SamplingParams


class RowState:
    def __init__(self, rows: int, width: int, page_size: int, req_to_token: np.ndarray) -> None:
        if req_to_token.shape != (rows, width):
            raise ValueError(f"page table shape {req_to_token.shape}, expected {(rows, width)}")
        self.page_size = page_size
        self.width = width
        self.req_to_token = req_to_token
        i32 = np.int32
        # np.zeros maps pages lazily: a long context costs only the rows actually used.
        self.tokens = np.zeros((rows, width), dtype=i32)
        self.pages = np.zeros((rows, -(-width // page_size)), dtype=i32)
        self.n_pages = np.zeros(rows, dtype=i32)
        self.tree_pages = np.zeros(rows, dtype=i32)
        self.kv_len = np.zeros(rows, dtype=i32)
        self.kv_done = np.zeros(rows, dtype=i32)
        self.n_known = np.zeros(rows, dtype=i32)
        self.pending = np.zeros(rows, dtype=i32)
        self.drafts = np.zeros(rows, dtype=i32)
        self.prompt_len = np.zeros(rows, dtype=i32)
        self.max_total = np.zeros(rows, dtype=i32)
        self.cached = np.zeros(rows, dtype=i32)
        self.uid = np.full(rows, -1, dtype=np.int64)
        self.last_step = np.full(rows, -1, dtype=np.int64)
        # sampling parameters
        self.temperature = np.ones(rows, dtype=np.float32)
        self.top_p = np.ones(rows, dtype=np.float32)
        self.top_k = np.full(rows, -1, dtype=i32)
        self.min_p = np.zeros(rows, dtype=np.float32)
        self.repetition_penalty = np.ones(rows, dtype=np.float32)
        self.frequency_penalty = np.zeros(rows, dtype=np.float32)
        self.presence_penalty = np.zeros(rows, dtype=np.float32)
        self.seeds = np.full(rows, -1, dtype=np.int64)
        self.logprobs = np.full(rows, -1, dtype=i32)
        self.min_tokens = np.zeros(rows, dtype=i32)
        self.ignore_eos = np.zeros(rows, dtype=bool)
        self.has_stop_ids = np.zeros(rows, dtype=bool)
        self.has_penalty = np.zeros(rows, dtype=bool)
        self.has_bias = np.zeros(rows, dtype=bool)
        self.grammar_id = np.full(rows, -1, dtype=np.int64)  # worker matcher (-1: none)
        self.prompt_top_n = np.full(rows, -1, dtype=i32)  # scores its prompt (-1: no)
        self.embed = np.zeros(rows, dtype=np.int8)  # ForwardBatch.embed of its chunks
        self.index = np.zeros(rows, dtype=i32)  # sample index (n > 1)
        self.fresh = np.zeros(rows, dtype=bool)  # its request may still need announcing

    def bind(self, row: int, uid: int, tokens: np.ndarray, prompt_len: int, max_total: int,
             sp: SamplingParams, index: int, has_stop_ids: bool, grammar_id: int = -1) -> None:
        n = int(tokens.shape[0])
        self.tokens[row, :n] = tokens
        self.n_known[row] = n
        self.pending[row] = 0
        self.drafts[row] = 0
        self.kv_len[row] = 0
        self.kv_done[row] = 0
        self.n_pages[row] = 0
        self.tree_pages[row] = 0
        self.prompt_len[row] = prompt_len
        self.max_total[row] = max_total
        self.uid[row] = uid
        self.temperature[row] = sp.temperature
        self.top_p[row] = sp.top_p
        self.top_k[row] = sp.top_k
        self.min_p[row] = sp.min_p
        self.repetition_penalty[row] = sp.repetition_penalty
        self.frequency_penalty[row] = sp.frequency_penalty
        self.presence_penalty[row] = sp.presence_penalty
        # n > 1: distinct, reproducible streams per sample index.
        self.seeds[row] = -1 if sp.seed is None else (sp.seed + index) & (2**63 - 1)
        self.logprobs[row] = -1 if sp.logprobs is None else sp.logprobs
        self.min_tokens[row] = sp.min_tokens
        self.ignore_eos[row] = sp.ignore_eos
        self.has_stop_ids[row] = has_stop_ids
        self.has_penalty[row] = sp.has_penalties
        self.has_bias[row] = bool(sp.logit_bias)
        self.grammar_id[row] = grammar_id
        # Only the first sample scores the prompt (the others share it).
        top_n = sp.prompt_logprobs
        self.prompt_top_n[row] = top_n if top_n is not None and index == 0 else -1
        self.embed[row] = {"last": ForwardBatch.EMBED_LAST, "mean": ForwardBatch.EMBED_MEAN}.get(
            sp.embed or "", 0)
        self.index[row] = index

    def set_prefix(self, row: int, pages: np.ndarray) -> None:
        """Start the row with cached pages (whole pages of matched tokens)."""
        k = int(pages.shape[0])
        self.pages[row, :k] = pages
        self.n_pages[row] = k
        self.tree_pages[row] = k
        self.kv_len[row] = k * self.page_size
        self.kv_done[row] = k * self.page_size
        self.cached[row] = k * self.page_size
        if k:
            self.write_slots(row, 0, k * self.page_size)

    def pages_needed(self, row: int, extend: int) -> int:
        total = int(self.kv_len[row]) + extend
        return -(-total // self.page_size) - int(self.n_pages[row])

    def add_pages(self, row: int, new_pages: np.ndarray) -> None:
        n0 = int(self.n_pages[row])
        self.pages[row, n0:n0 + new_pages.shape[0]] = new_pages
        self.n_pages[row] = n0 + new_pages.shape[0]

    def write_slots(self, row: int, start: int, end: int) -> None:
        """req_to_token[row, start:end] = the KV slots of those positions."""
        pos = np.arange(start, end, dtype=np.int32)
        ps = self.page_size
        self.req_to_token[row, start:end] = self.pages[row, pos // ps] * ps + pos % ps

    def unbind(self, row: int) -> None:
        self.uid[row] = -1
        self.pending[row] = 0
        self.drafts[row] = 0
