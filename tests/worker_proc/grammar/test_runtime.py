"""Rank 0's grammar runtime on the cpu plugin, driven as the pipelined worker drives it
(drive.py). Whatever the logits, the output must follow the grammar and end when it is
complete."""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import numpy as np
import pytest
import torch

from tessera.bus.messages import SampledTokens
from tessera.hal.registry import load_platform
from tessera.worker_proc.grammar.runtime import GrammarRuntime
from tessera.worker_proc.sampler import Sampler
from tests.worker_proc.grammar.conftest import EOS, VOCAB
from tests.worker_proc.grammar.drive import (
    REGEX,
    SCHEMA,
    follows_schema,
    make_batch,
    parse_json,
    ready_runtime,
    run,
)

CPU = torch.device("cpu")


@pytest.fixture
def runtime(info: Any) -> GrammarRuntime:
    return ready_runtime(info, VOCAB, load_platform("cpu"), CPU)


@pytest.fixture
def sampler() -> Sampler:
    platform = load_platform("cpu")
    return Sampler(platform, CPU, platform.op("apply_token_mask"))


def _text(tokenizer: Any, ids: list[int]) -> str:
    assert ids[-1] == EOS, "a finished grammar ends with the stop token"
    return tokenizer.decode(ids[:-1], skip_special_tokens=False)


@pytest.mark.parametrize("seed", range(2))
def test_outputs_follow_their_grammars_under_overlap(runtime: GrammarRuntime, sampler: Sampler,
                                                     tokenizer: Any, seed: int) -> None:
    out, ended = run(runtime, sampler, [0, -1, 2, 1], VOCAB, seed=seed, device=CPU)
    assert set(ended) == {0, 2, 3} and 1 not in ended  # the free row never "ends"
    for i in (0, 3):
        assert re.fullmatch(REGEX, _text(tokenizer, out[i])), _text(tokenizer, out[i])
    jsonschema.validate(parse_json(_text(tokenizer, out[2])), SCHEMA)
    assert follows_schema(parse_json(_text(tokenizer, out[2])))  # the GPU test's check
    assert runtime.masked_rows > 0


def test_a_dropped_token_is_rolled_back(runtime: GrammarRuntime, sampler: Sampler,
                                        tokenizer: Any) -> None:
    out, ended = run(runtime, sampler, [2], VOCAB, seed=7, device=CPU, drop_at=3)
    assert ended
    jsonschema.validate(parse_json(_text(tokenizer, out[0])), SCHEMA)


def test_unknown_matchers_fail_and_freed_ones_are_forgotten(runtime: GrammarRuntime,
                                                            sampler: Sampler) -> None:
    import dataclasses

    batch = dataclasses.replace(make_batch(2), grammar_ids=np.array([9, 0], np.int64),
                                grammar_free=np.array([1, 2], np.int64))
    runtime.free(batch)
    assert set(runtime.table.slots) == {0}
    mask, record = runtime.before_sample(batch, np.arange(2))
    assert mask is not None and mask.rows.tolist() == [1]
    sample = sampler.sample(torch.randn(2, VOCAB), batch, mask)
    runtime.after_sample(record, lambda: sample.fetch().token_ids)
    assert runtime.step_ends(0).tolist() == [SampledTokens.GRAMMAR_FAILED, 0]
