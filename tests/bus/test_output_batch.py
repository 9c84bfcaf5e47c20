"""RequestOutputBatch: outputs packed as columns come back field for field, through the codec
too; a batch whose columns disagree is refused with a clear error."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tessera.bus import codec
from tessera.bus.messages import RequestOutput, RequestOutputBatch
from tessera.bus.output_batch import pack_outputs, unpack_outputs


def _plain(n_tokens: int, rid: str = "r", finish: str | None = None) -> RequestOutput:
    return RequestOutput(rid=rid, index=1, text="héllo 🎉" * n_tokens,
                         token_ids=np.arange(n_tokens, dtype=np.int32) + 5,
                         finish_reason=finish, prompt_tokens=9, completion_tokens=n_tokens,
                         cached_tokens=4, decode_steps=max(1, n_tokens // 2))


def _with_logprobs(n_tokens: int, k: int, rid: str) -> RequestOutput:
    base = _plain(n_tokens, rid)
    lps = -np.arange(n_tokens, dtype=np.float32)
    top = np.arange(n_tokens * k, dtype=np.int32).reshape(n_tokens, k)
    return dataclasses.replace(
        base, logprobs=lps, top_ids=top, top_logprobs=-top.astype(np.float32),
        token_texts=[f"t{i}" for i in range(n_tokens)],
        top_token_texts=[[f"a{i}.{j}" for j in range(k)] for i in range(n_tokens)])


def _same(a: RequestOutput, b: RequestOutput) -> None:
    for f in dataclasses.fields(RequestOutput):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            if x.size or y.size:
                assert x.dtype == y.dtype and x.tolist() == y.tolist(), f.name
        else:
            assert x == y, f.name


@pytest.mark.parametrize("through_codec", [False, True])
def test_round_trip(through_codec: bool) -> None:
    cases = [
        [_plain(1, "a"), _plain(0, "b", "stop"), _plain(3, "c")],
        [_with_logprobs(2, 3, "a"), _plain(1, "b"), _with_logprobs(1, 0, "c"),
         _with_logprobs(0, 2, "d"), _with_logprobs(3, 1, "e")],
        [],
    ]
    for outputs in cases:
        batch = pack_outputs(outputs)
        if through_codec:
            batch = codec.decode([bytes(f) for f in codec.encode(batch)])
        got = unpack_outputs(batch)
        assert len(got) == len(outputs)
        for a, b in zip(outputs, got, strict=True):
            _same(a, b)


def test_inconsistent_columns_are_refused() -> None:
    good = pack_outputs([_plain(2, "a"), _plain(1, "b")])
    bad = [
        dataclasses.replace(good, texts=["x"]),
        dataclasses.replace(good, token_offsets=np.array([0, 1, 2], np.int32)),
        dataclasses.replace(good, token_offsets=np.array([0, 4, 3], np.int32)),
        dataclasses.replace(good, token_offsets=np.array([0, 3], np.int32)),
        dataclasses.replace(good, decode_steps=[1]),
    ]
    lp = pack_outputs([_with_logprobs(2, 2, "a")])
    bad += [dataclasses.replace(lp, top_widths=[5]),
            dataclasses.replace(lp, top_ids=lp.top_ids[:1]),
            dataclasses.replace(lp, token_texts=[])]
    for batch in bad:
        assert isinstance(batch, RequestOutputBatch)
        with pytest.raises(ValueError, match="RequestOutputBatch"):
            unpack_outputs(batch)


def test_outputs_with_a_scored_prompt_are_not_batched() -> None:
    scored = dataclasses.replace(_plain(1, "p"), prompt_token_ids=np.array([5, 6], np.int32),
                                 prompt_logprobs=np.array([np.nan, -0.5], np.float32))
    assert pack_outputs([_plain(1)]).rids == ["r"]
    with pytest.raises(ValueError, match="scored prompt"):
        pack_outputs([_plain(1), scored])


def test_outputs_with_an_embedding_are_not_batched() -> None:
    from tessera.bus.output_batch import batchable

    embedded = dataclasses.replace(_plain(1, "e"), embedding=np.ones(4, np.float32))
    assert not batchable(embedded) and batchable(_plain(1))
    with pytest.raises(ValueError, match="embedding"):
        pack_outputs([embedded])
