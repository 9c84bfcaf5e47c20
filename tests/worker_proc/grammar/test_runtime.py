"""Rank 0's grammar runtime driven like the pipelined worker drives it: random logits (any
token is likely), the cpu sampler with the HAL's apply_token_mask, step n+1's mask built
before step n's answer is taken, tokens the scheduler dropped rolled back. Whatever the
logits, the output must follow the grammar and end when it is complete."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import jsonschema
import numpy as np
import pytest
import torch

from tessera.bus.messages import ForwardBatch, GrammarInit, GrammarSpec, SampledTokens
from tessera.hal.registry import load_platform
from tessera.worker_proc.grammar.compiler import GrammarCompiler
from tessera.worker_proc.grammar.runtime import GrammarRuntime
from tessera.worker_proc.sampler import Sampler
from tests.worker_proc.grammar.conftest import EOS, VOCAB
from tests.worker_proc.test_sampler import make_batch

REGEX = r"(yes|no), [0-9]{2}"
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "kind": {"enum": ["cat", "dog"]},
    "tags": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
             "maxItems": 3}},
    "required": ["name", "kind", "tags"]}


@pytest.fixture
def runtime(info: Any) -> GrammarRuntime:
    rt = GrammarRuntime(GrammarCompiler(lambda: info), VOCAB,
                        lambda a, dtype: torch.from_numpy(np.ascontiguousarray(a)).to(dtype))
    rt.init(GrammarInit(first_id=0, count=2, grammar=GrammarSpec("regex", REGEX, "regex")))
    rt.init(GrammarInit(first_id=2, count=1, grammar=GrammarSpec(
        "json_schema", json.dumps(SCHEMA), "response_format")))
    replies: list[Any] = []
    deadline = time.monotonic() + 60
    while len(replies) < 2 and time.monotonic() < deadline:
        replies += rt.ready()
        time.sleep(0.01)
    assert sorted((r.first_id, r.error) for r in replies) == [(0, None), (2, None)]
    return rt


@pytest.fixture
def sampler() -> Sampler:
    platform = load_platform("cpu")
    return Sampler(platform.op("sample"), torch.device("cpu"), platform.op("apply_token_mask"))


def _run(rt: GrammarRuntime, sampler: Sampler, gids: list[int], *, seed: int,
         drop_at: int | None = None, max_steps: int = 200) -> tuple[dict[int, list[int]], dict]:
    """Decode every row to its grammar's end; rows without a grammar (-1) ride along."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[int, list[int]] = {i: [] for i in range(len(gids))}
    ended: dict[int, int] = {}
    launched: list[tuple[int, list[int]]] = []  # (step, rows) not answered yet
    dropped: set[int] = set()
    for step in range(max_steps):
        rows = [i for i in range(len(gids)) if i not in ended]
        if all(gids[i] < 0 for i in rows):
            break  # every constrained row ended
        if step == drop_at:
            dropped.add(rows[0])  # the scheduler will drop the token in flight for this row
        # As the scheduler counts them: the tokens received plus the one still in flight.
        in_flight = {i for _, launched_rows in launched for i in launched_rows} - dropped
        batch: ForwardBatch = make_batch(
            len(rows), temperature=np.full(len(rows), 1.0), seeds=[seed * 1000 + step] * len(rows),
            output_lens=[len(out[i]) + (i in in_flight) for i in rows])
        batch = _with(batch, step=step, grammar_ids=np.array([gids[i] for i in rows], np.int64))
        logits = torch.randn(len(rows), VOCAB, generator=gen) * 3
        mask, record = rt.before_sample(batch, np.arange(len(rows)))
        sample = sampler.sample(logits, batch, mask)
        sample.start_copy()
        rt.after_sample(record, lambda s=sample: s.fetch().token_ids)
        launched.append((step, rows))
        if len(launched) == 2 or step == max_steps - 1:  # answer step n after launching n+1
            done_step, done_rows = launched.pop(0)
            _answer(rt, done_step, done_rows, out, ended, sampler_tokens[done_step], dropped)
        sampler_tokens[step] = sample.fetch().token_ids
    while launched:
        done_step, done_rows = launched.pop(0)
        _answer(rt, done_step, done_rows, out, ended, sampler_tokens[done_step], dropped)
    return out, ended


sampler_tokens: dict[int, np.ndarray] = {}


def _answer(rt: GrammarRuntime, step: int, rows: list[int], out: dict[int, list[int]],
            ended: dict[int, int], tokens: np.ndarray, dropped: set[int]) -> None:
    ends = rt.step_ends(step)
    for pos, i in enumerate(rows):
        if i in ended:
            continue  # finished in the previous step: the scheduler drops this token
        if i in dropped:
            dropped.discard(i)
            continue
        out[i].append(int(tokens[pos]))
        if ends.shape[0] and ends[pos] == SampledTokens.GRAMMAR_DONE:
            ended[i] = step
        assert not ends.shape[0] or ends[pos] != SampledTokens.GRAMMAR_FAILED


def _with(batch: ForwardBatch, **fields: Any) -> ForwardBatch:
    import dataclasses

    return dataclasses.replace(batch, **fields)


def _text(tokenizer: Any, ids: list[int]) -> str:
    assert ids[-1] == EOS, "a finished grammar ends with the stop token"
    return tokenizer.decode(ids[:-1], skip_special_tokens=False)


@pytest.mark.parametrize("seed", range(2))
def test_outputs_follow_their_grammars_under_overlap(runtime: GrammarRuntime, sampler: Sampler,
                                                     tokenizer: Any, seed: int) -> None:
    out, ended = _run(runtime, sampler, [0, -1, 2, 1], seed=seed)
    assert set(ended) == {0, 2, 3} and 1 not in ended  # the free row never "ends"
    for i in (0, 3):
        assert re.fullmatch(REGEX, _text(tokenizer, out[i])), _text(tokenizer, out[i])
    jsonschema.validate(json.loads(_text(tokenizer, out[2])), SCHEMA)
    assert runtime.masked_rows > 0


def test_a_dropped_token_is_rolled_back(runtime: GrammarRuntime, sampler: Sampler,
                                        tokenizer: Any) -> None:
    out, ended = _run(runtime, sampler, [2], seed=7, drop_at=3)
    assert ended
    jsonschema.validate(json.loads(_text(tokenizer, out[0])), SCHEMA)


def test_unknown_matchers_fail_and_freed_ones_are_forgotten(runtime: GrammarRuntime,
                                                            sampler: Sampler) -> None:
    batch = _with(make_batch(2), grammar_ids=np.array([9, 0], np.int64),
                  grammar_free=np.array([1, 2], np.int64))
    runtime.free(batch)
    assert set(runtime.table.slots) == {0}
    mask, record = runtime.before_sample(batch, np.arange(2))
    assert mask is not None and mask.rows.tolist() == [1]
    sample = sampler.sample(torch.randn(2, VOCAB), batch, mask)
    runtime.after_sample(record, lambda: sample.fetch().token_ids)
    assert runtime.step_ends(0).tolist() == [SampledTokens.GRAMMAR_FAILED, 0]
