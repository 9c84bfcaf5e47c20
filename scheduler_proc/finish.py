"""When a sampled token ends its sequence, decided for a whole step at once.

"stop": an EOS id (unless ignore_eos) or one of the request's stop_token_ids, once at least
min_tokens were generated (the worker blocks them before that; checked here too). "length":
prompt + output reached the request's limit (max_tokens, or the context / pool). Stop strings
are the detokenizer's: it tells us with AbortRequest(reason="stop"). A grammar that the
token completed (worker rank 0 says so in SampledTokens.grammar_end) is a "stop" as well; one
the grammar engine could not follow fails its request.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tessera.bus.messages import SampledTokens
from tessera.scheduler_proc.request import Sequence
from tessera.scheduler_proc.rows import RowState


class Finish(NamedTuple):
    done: list[int]  # positions (in `rows`) of the sequences that finished
    reasons: list[str | None]  # per position
    matched: list[int | None]  # the stop token, per position, for "stop"
    failed: list[int] = []  # positions whose grammar failed (their requests are failed)


def detect(st: RowState, rows: np.ndarray, toks: np.ndarray, eos: tuple[int, ...],
           seq_of_row: list[Sequence | None], grammar_end: np.ndarray | None = None) -> Finish:
    """`toks` were just appended: st.n_known[rows] already counts them. `grammar_end`:
    SampledTokens.grammar_end of these rows, when any had a grammar."""
    n = st.n_known[rows]
    stop = np.zeros(rows.shape[0], dtype=bool)
    for e in eos:  # a few ids: cheaper than np.isin
        stop |= toks == e
    if eos:
        stop &= ~st.ignore_eos[rows]
    for i in np.flatnonzero(st.has_stop_ids[rows]).tolist():  # rare: a Python loop is fine
        seq = seq_of_row[int(rows[i])]
        if seq is not None and int(toks[i]) in seq.req.stop_ids:
            stop[i] = True
    stop &= (n - st.prompt_len[rows]) >= st.min_tokens[rows]
    failed: list[int] = []
    if grammar_end is not None:
        stop |= grammar_end == SampledTokens.GRAMMAR_DONE
        failed = np.flatnonzero(grammar_end == SampledTokens.GRAMMAR_FAILED).tolist()
    length = n >= st.max_total[rows]
    done = np.flatnonzero(stop | length).tolist()
    reasons: list[str | None] = [None] * rows.shape[0]
    matched: list[int | None] = [None] * rows.shape[0]
    for i in done:
        reasons[i] = "stop" if stop[i] else "length"
        matched[i] = int(toks[i]) if stop[i] else None
    return Finish(done, reasons, matched, failed)


def stop_tokens(st: RowState, rows: np.ndarray, owner: np.ndarray, toks: np.ndarray,
                eos: tuple[int, ...], seq_of_row: list[Sequence | None]) -> np.ndarray:
    """Several tokens per row (speculative decoding): bool per token, whether it would end its
    row (rows[owner[t]]) as a stop. Not yet appended: st.n_known[rows] counts none of them."""
    tok_rows = rows[owner]
    stop = np.zeros(toks.shape[0], dtype=bool)
    for e in eos:
        stop |= toks == e
    if eos:
        stop &= ~st.ignore_eos[tok_rows]
    with_ids = np.flatnonzero(st.has_stop_ids[rows])
    for i in with_ids.tolist():  # rare: a Python loop is fine
        seq = seq_of_row[int(rows[i])]
        if seq is not None and seq.req.stop_ids:
            mine = owner == i
            stop[mine] |= np.isin(toks[mine], np.fromiter(seq.req.stop_ids, dtype=np.int64))
    if stop.any():
        first = np.searchsorted(owner, owner, side="left")
        out_len = st.n_known[tok_rows] + (np.arange(toks.shape[0]) - first) + 1 \
            - st.prompt_len[tok_rows]
        stop &= out_len >= st.min_tokens[tok_rows]
    return stop
