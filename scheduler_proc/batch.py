"""Assemble one ForwardBatch from the rows chosen for a step, and remember what was sent.

Decodes come first (one token each, or 1 + proposals for a decode that verifies proposals;
built with numpy over all decode rows at once), then prefill chunks. The in-flight record keeps, per request of the batch, the row and the uid of
the sequence bound to it when the step was built: a result is applied to a row only if the
same sequence still holds it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from tessera.bus.messages import ForwardBatch
from tessera.scheduler_proc.request import Sequence
from tessera.scheduler_proc.rows import RowState


@dataclass
class Chunk:
    """A prefill chunk: positions [start, start + extend) of the row's known tokens."""

    row: int
    start: int
    extend: int
    sample: bool


@dataclass
class Scored:
    """A request scoring its prompt in this step: the prompt tokens whose logprobs the step
    returns, in order (the prompt's first token, which has none, leads when `first`)."""

    row: int
    uid: int
    ids: np.ndarray
    first: bool
    end: int  # prompt tokens reported once this step's are

    @property
    def computed(self) -> int:
        """Logprobs the worker returns for this request."""
        return int(self.ids.shape[0]) - int(self.first)


@dataclass
class Embedded:
    """A request's prefill chunk whose pooled hidden states the step returns."""

    row: int
    uid: int
    start: int  # the chunk's first position
    final: bool  # the chunk ends the prompt


@dataclass
class InFlight:
    step: int
    rows: np.ndarray  # every request of the batch
    uids: np.ndarray
    seq_lens: np.ndarray
    sampled_rows: np.ndarray  # those with sample == 1, in order (the result's order)
    sampled_uids: np.ndarray
    prefill_rows: np.ndarray  # rows that ran a prefill chunk (their KV may be cached)
    prefill_uids: np.ndarray
    sent_at: float
    build_cpu_s: float = 0.0
    scored: list[Scored] = field(default_factory=list)
    embedded: list[Embedded] = field(default_factory=list)
    tokens: int = 0  # tokens computed by the step (prefill chunks + decodes + proposals)
    draft_lens: np.ndarray | None = None  # per sampled row: proposals it verifies (or None)
    sampled_seq_lens: np.ndarray | None = None  # per sampled row, with draft_lens
    draft_tokens: int = 0  # proposals verified by the step


def build(step: int, st: RowState, dec_rows: np.ndarray, dec_inputs: np.ndarray,
          chunks: list[Chunk], seq_of_row: list[Sequence | None],
          grammar_free: np.ndarray | None = None, dec_drafts: np.ndarray | None = None
          ) -> tuple[ForwardBatch, InFlight]:
    """The step's ForwardBatch and its in-flight record. `grammar_free`: matcher ids of
    sequences that ended, for the worker to drop. `dec_drafts`: the proposals each decode
    verifies, when some do (dec_inputs then holds 1 + that many ids for each)."""
    n_dec = int(dec_rows.shape[0])
    verifying = dec_drafts is not None
    if dec_drafts is None:
        dec_drafts = np.zeros(n_dec, dtype=np.int32)
    dec_extend = dec_drafts + 1
    if chunks:
        ch_rows = np.fromiter((c.row for c in chunks), dtype=np.int32, count=len(chunks))
        ch_ext = np.fromiter((c.extend for c in chunks), dtype=np.int32, count=len(chunks))
        ch_sample = np.fromiter((c.sample for c in chunks), dtype=np.uint8, count=len(chunks))
        rows = np.concatenate([dec_rows, ch_rows])
        extend = np.concatenate([dec_extend, ch_ext])
        sample = np.concatenate([np.ones(n_dec, dtype=np.uint8), ch_sample])
        input_ids = np.concatenate(
            [dec_inputs] + [st.tokens[c.row, c.start:c.start + c.extend] for c in chunks])
    else:
        rows = dec_rows
        extend = dec_extend
        sample = np.ones(n_dec, dtype=np.uint8)
        input_ids = dec_inputs
    draft_lens = np.zeros(0, dtype=np.int32)
    if verifying:
        draft_lens = np.concatenate([dec_drafts, np.zeros(len(chunks), dtype=np.int32)])
    seq_lens = st.kv_len[rows]  # kv_len was advanced when the step was planned
    output_lens = st.n_known[rows] + st.pending[rows] - st.prompt_len[rows]
    # pending was set for rows sampling in this step: do not count this step's own token.
    output_lens -= sample.astype(np.int32)
    # A decode's first draw is at the output position after its input token: for a chained
    # verify (its row's verify in flight) that is past the proposals in flight.
    output_lens[:n_dec] = seq_lens[:n_dec] - dec_extend + 1 - st.prompt_len[dec_rows]
    block_offsets, block_ids = _blocks(rows, sample, output_lens, st, seq_of_row)
    hist = _history(rows, st, seq_of_row)
    bias = _bias(rows, sample, st, seq_of_row)
    grammar_ids = st.grammar_id[rows]
    if not (grammar_ids >= 0).any():
        grammar_ids = np.zeros(0, dtype=np.int64)
    targets, top_n, scored = _prompt_targets(rows, extend, int(dec_extend.sum()), chunks, st,
                                             seq_of_row)
    embed, embedded = _embeds(rows, n_dec, chunks, st)
    batch = ForwardBatch(
        step=step, rows=rows.astype(np.int32, copy=False), seq_lens=seq_lens,
        extend_lens=extend, input_ids=input_ids.astype(np.int32, copy=False), sample=sample,
        output_lens=output_lens, temperature=st.temperature[rows], top_p=st.top_p[rows],
        top_k=st.top_k[rows], min_p=st.min_p[rows],
        repetition_penalty=st.repetition_penalty[rows],
        frequency_penalty=st.frequency_penalty[rows],
        presence_penalty=st.presence_penalty[rows], seeds=st.seeds[rows],
        logprobs=st.logprobs[rows], block_offsets=block_offsets, block_ids=block_ids,
        hist_offsets=hist[0], hist_ids=hist[1], hist_prompt_lens=hist[2],
        bias_offsets=bias[0], bias_ids=bias[1], bias_values=bias[2], grammar_ids=grammar_ids,
        grammar_free=grammar_free if grammar_free is not None else np.zeros(0, np.int64),
        prompt_targets=targets, prompt_top_n=top_n, draft_lens=draft_lens, embed=embed,
        is_decode=not chunks and not verifying,
    )
    sampled = sample.astype(bool)
    uids = st.uid[rows]
    record = InFlight(step=step, rows=rows, uids=uids, seq_lens=seq_lens,
                      sampled_rows=rows[sampled], sampled_uids=uids[sampled],
                      prefill_rows=rows[n_dec:], prefill_uids=uids[n_dec:],
                      sent_at=time.monotonic(), tokens=int(extend.sum()), scored=scored,
                      embedded=embedded)
    if verifying:
        record.draft_lens = draft_lens[sampled]
        record.sampled_seq_lens = seq_lens[sampled]
        record.draft_tokens = int(dec_drafts.sum())
    return batch, record


def _blocks(rows: np.ndarray, sample: np.ndarray, output_lens: np.ndarray, st: RowState,
            seq_of_row: list[Sequence | None]) -> tuple[np.ndarray, np.ndarray]:
    """CSR of token ids forbidden this step: stop/EOS ids while output_len < min_tokens."""
    active = (sample == 1) & (output_lens < st.min_tokens[rows])
    if not active.any():
        return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32)
    counts = np.zeros(rows.shape[0], dtype=np.int32)
    parts: list[np.ndarray] = []
    for i in np.flatnonzero(active).tolist():
        seq = seq_of_row[int(rows[i])]
        assert seq is not None
        ids = seq.req.block_ids
        counts[i] = ids.shape[0]
        parts.append(ids)
    offsets = np.zeros(rows.shape[0] + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return offsets, np.concatenate(parts).astype(np.int32)


def _prompt_targets(rows: np.ndarray, extend: np.ndarray, dec_tokens: int,
                    chunks: list[Chunk], st: RowState, seq_of_row: list[Sequence | None]
                    ) -> tuple[np.ndarray, np.ndarray, list[Scored]]:
    """ForwardBatch.prompt_targets / prompt_top_n for the chunks of requests scoring their
    prompt: position p asks for the logprob of the prompt token at p + 1, for every prompt
    token not reported yet (a retracted request recomputes, but never reports twice)."""
    empty = np.zeros(0, dtype=np.int32)
    top_n = st.prompt_top_n[rows]
    n_dec = rows.shape[0] - len(chunks)
    if not chunks or not (top_n[n_dec:] >= 0).any():
        return empty, empty, []
    targets = np.full(int(extend.sum()), -1, dtype=np.int32)
    scored: list[Scored] = []
    offset = dec_tokens  # decodes come first
    for chunk in chunks:
        row = chunk.row
        seq = seq_of_row[row]
        if st.prompt_top_n[row] >= 0 and seq is not None:
            prompt_len = int(st.prompt_len[row])
            # entry e (the prompt token at position e) comes from position e - 1
            first_entry = max(seq.prompt_scored, chunk.start + 1)
            last_entry = min(prompt_len, chunk.start + chunk.extend + 1)  # exclusive
            if last_entry > first_entry:
                at = offset + (first_entry - 1 - chunk.start)
                targets[at:at + last_entry - first_entry] = st.tokens[row,
                                                                      first_entry:last_entry]
            includes_first = seq.prompt_scored == 0 and chunk.start == 0
            ids = st.tokens[row, first_entry:max(first_entry, last_entry)].copy()
            if includes_first:
                ids = np.concatenate([st.tokens[row, :1], ids])
            if ids.shape[0]:
                scored.append(Scored(row, int(st.uid[row]), ids.astype(np.int32),
                                     includes_first, max(first_entry, last_entry)))
        offset += chunk.extend
    return targets, top_n.astype(np.int32), scored


def _embeds(rows: np.ndarray, n_dec: int, chunks: list[Chunk], st: RowState
            ) -> tuple[np.ndarray, list[Embedded]]:
    """ForwardBatch.embed: the prefill chunks of requests that want their prompt embedded."""
    modes = st.embed[rows].copy()
    modes[:n_dec] = 0  # a decode never embeds
    if not (modes > 0).any():
        return np.zeros(0, dtype=np.int8), []
    embedded = [Embedded(c.row, int(st.uid[c.row]), c.start,
                         c.start + c.extend >= int(st.prompt_len[c.row]))
                for c in chunks if st.embed[c.row] > 0]
    return modes, embedded


def _bias(rows: np.ndarray, sample: np.ndarray, st: RowState,
          seq_of_row: list[Sequence | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR of the logit_bias (token ids, values) of sampling requests (empty if none)."""
    active = st.has_bias[rows] & (sample == 1)
    if not active.any():
        return np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float32)
    counts = np.zeros(rows.shape[0], dtype=np.int32)
    ids: list[np.ndarray] = []
    values: list[np.ndarray] = []
    for i in np.flatnonzero(active).tolist():
        seq = seq_of_row[int(rows[i])]
        assert seq is not None and seq.req.bias_ids is not None
        assert seq.req.bias_values is not None
        counts[i] = seq.req.bias_ids.shape[0]
        ids.append(seq.req.bias_ids)
        values.append(seq.req.bias_values)
    offsets = np.zeros(rows.shape[0] + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return offsets, np.concatenate(ids), np.concatenate(values)


def _history(rows: np.ndarray, st: RowState, seq_of_row: list[Sequence | None]
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR of prompt + output tokens of requests with penalties (empty if there are none)."""
    active = st.has_penalty[rows]
    empty = np.zeros(0, dtype=np.int32)
    if not active.any():
        return empty, empty, empty
    counts = np.zeros(rows.shape[0], dtype=np.int32)
    prompt_lens = np.zeros(rows.shape[0], dtype=np.int32)
    parts: list[np.ndarray] = []
    for i in np.flatnonzero(active).tolist():
        row = int(rows[i])
        n = int(st.n_known[row])
        counts[i] = n
        seq = seq_of_row[row]
        assert seq is not None
        prompt_lens[i] = min(seq.req.prompt_len, n)
        parts.append(st.tokens[row, :n])
    offsets = np.zeros(rows.shape[0] + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return offsets, np.concatenate(parts).astype(np.int32), prompt_lens
