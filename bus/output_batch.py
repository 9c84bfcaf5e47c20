"""RequestOutputs to and from the columns of a RequestOutputBatch (bus/messages.py).

    batch = pack_outputs(outputs)      # the detokenizer, once per step and client
                                       # (outputs carrying a scored prompt: see batchable)
    outputs = unpack_outputs(batch)    # the client's receiver thread

`unpack_outputs(pack_outputs(xs)) == xs` field by field (tests/bus/test_output_batch.py). A
batch whose columns disagree (a peer's bug, a damaged message) raises ValueError naming what
is wrong; the receiver counts and drops it like any malformed message.
"""

from __future__ import annotations

import numpy as np

from tessera.bus.messages import RequestOutput, RequestOutputBatch


def _offsets(counts: list[int]) -> np.ndarray:
    out = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(counts, out=out[1:])
    return out


def batchable(out: RequestOutput) -> bool:
    """Whether a batch can carry it: the scored prompt of a prompt-logprobs request and the
    vector of an embedding request (each sent once per such request) travel in a
    RequestOutput of their own."""
    return not (out.prompt_token_ids.shape[0] or out.prompt_logprobs.shape[0]
                or out.prompt_token_texts or out.embedding.shape[0])


def pack_outputs(outputs: list[RequestOutput]) -> RequestOutputBatch:
    """Outputs for which `batchable` holds, as one batch (ValueError for any other)."""
    if not all(batchable(o) for o in outputs):
        raise ValueError("an output with a scored prompt or an embedding travels as a "
                         "RequestOutput")
    token_ids = [o.token_ids for o in outputs]
    columns = dict(
        rids=[o.rid for o in outputs], indices=[o.index for o in outputs],
        texts=[o.text for o in outputs],
        token_offsets=_offsets([t.shape[0] for t in token_ids]),
        token_ids=np.concatenate(token_ids).astype(np.int32, copy=False) if token_ids
        else np.zeros(0, np.int32),
        finish_reasons=[o.finish_reason for o in outputs],
        prompt_tokens=[o.prompt_tokens for o in outputs],
        completion_tokens=[o.completion_tokens for o in outputs],
        cached_tokens=[o.cached_tokens for o in outputs],
        decode_steps=[o.decode_steps for o in outputs])
    if not any(o.logprobs.shape[0] for o in outputs):
        return RequestOutputBatch(**columns)  # type: ignore[arg-type]
    widths = [o.top_ids.shape[1] if o.top_ids.ndim == 2 else 0 for o in outputs]
    rows = sum(o.logprobs.shape[0] for o in outputs)
    top_ids = np.full((rows, max(widths)), -1, np.int32)
    top_lps = np.full((rows, max(widths)), -np.inf, np.float32)
    start = 0
    for o, width in zip(outputs, widths, strict=True):
        end = start + o.logprobs.shape[0]
        if width:
            top_ids[start:end, :width] = o.top_ids
            top_lps[start:end, :width] = o.top_logprobs
        start = end
    return RequestOutputBatch(
        **columns,  # type: ignore[arg-type]
        logprob_offsets=_offsets([o.logprobs.shape[0] for o in outputs]),
        logprobs=np.concatenate([o.logprobs for o in outputs]).astype(np.float32, copy=False),
        top_widths=widths, top_ids=top_ids, top_logprobs=top_lps,
        token_texts=[list(o.token_texts) for o in outputs],
        top_token_texts=[[list(t) for t in o.top_token_texts] for o in outputs])


def _check(batch: RequestOutputBatch) -> int:
    rows = len(batch.rids)
    for name in ("indices", "texts", "finish_reasons", "prompt_tokens", "completion_tokens",
                 "cached_tokens"):
        if len(getattr(batch, name)) != rows:
            raise ValueError(f"RequestOutputBatch: {rows} rids but {len(getattr(batch, name))} "
                             f"{name}")
    if batch.decode_steps and len(batch.decode_steps) != rows:
        raise ValueError(f"RequestOutputBatch: {rows} rids but {len(batch.decode_steps)} "
                         f"decode_steps")
    _check_offsets(batch.token_offsets, rows, batch.token_ids.shape[0], "token")
    if batch.logprob_offsets.shape[0]:
        _check_offsets(batch.logprob_offsets, rows, batch.logprobs.shape[0], "logprob")
        lrows = batch.logprobs.shape[0]
        if batch.top_ids.ndim != 2 or batch.top_ids.shape != batch.top_logprobs.shape or \
                batch.top_ids.shape[0] != lrows:
            raise ValueError("RequestOutputBatch: top_ids / top_logprobs do not match logprobs")
        for name in ("top_widths", "token_texts", "top_token_texts"):
            if len(getattr(batch, name)) != rows:
                raise ValueError(f"RequestOutputBatch: {rows} rids but "
                                 f"{len(getattr(batch, name))} {name}")
        if any(not 0 <= w <= batch.top_ids.shape[1] for w in batch.top_widths):
            raise ValueError("RequestOutputBatch: a top width beyond top_ids")
    return rows


def _check_offsets(offsets: np.ndarray, rows: int, total: int, what: str) -> None:
    if offsets.shape != (rows + 1,) or (rows + 1 and (
            int(offsets[0]) != 0 or int(offsets[-1]) != total
            or bool((np.diff(offsets) < 0).any()))):
        raise ValueError(f"RequestOutputBatch: {what} offsets do not cover the {what} rows")


def unpack_outputs(batch: RequestOutputBatch) -> list[RequestOutput]:
    rows = _check(batch)
    toks = batch.token_offsets.tolist()
    with_logprobs = batch.logprob_offsets.shape[0] > 0
    lp = batch.logprob_offsets.tolist() if with_logprobs else []
    out: list[RequestOutput] = []
    for r in range(rows):
        extra = {}
        if with_logprobs:
            a, b, width = lp[r], lp[r + 1], batch.top_widths[r]
            extra = dict(logprobs=batch.logprobs[a:b], top_ids=batch.top_ids[a:b, :width],
                         top_logprobs=batch.top_logprobs[a:b, :width],
                         token_texts=batch.token_texts[r],
                         top_token_texts=batch.top_token_texts[r])
        out.append(RequestOutput(
            rid=batch.rids[r], index=batch.indices[r], text=batch.texts[r],
            token_ids=batch.token_ids[toks[r]:toks[r + 1]],
            finish_reason=batch.finish_reasons[r], prompt_tokens=batch.prompt_tokens[r],
            completion_tokens=batch.completion_tokens[r], cached_tokens=batch.cached_tokens[r],
            decode_steps=batch.decode_steps[r] if batch.decode_steps else 0,
            **extra))  # type: ignore[arg-type]
    return out
