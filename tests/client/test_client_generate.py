"""The blocking Client against the fake engine: results, streams, n, logprobs, inputs."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.bus.messages import GrammarSpec, SamplingParams
from tessera.client import BadRequestError, Client, GenerateResult
from tessera.client.testing import FakeEngine, token_text


def expected(count: int, index: int = 0) -> str:
    return "".join(token_text(k, index) for k in range(count))


def test_generate_returns_whole_text_with_usage(client: Client, engine: FakeEngine) -> None:
    result = client.generate("one two three", max_tokens=5)
    assert isinstance(result, GenerateResult)
    assert result.text == expected(5)
    assert result.finish_reason == "length"
    assert result.choices[0].token_ids == [100, 101, 102, 103, 104]
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (3, 5)
    assert result.usage.total_tokens == 8
    assert engine.requests[-1].prompt == "one two three"


def test_natural_stop_reports_stop(client: Client) -> None:
    result = client.generate("hi", SamplingParams(max_tokens=None))
    assert result.text == expected(8)
    assert result.finish_reason == "stop"


def test_stream_yields_deltas_in_order(client: Client) -> None:
    deltas = list(client.generate("hi", stream=True, max_tokens=6))
    assert [d.text for d in deltas] == [token_text(k, 0) for k in range(6)]
    assert [d.finish_reason for d in deltas] == [None] * 5 + ["length"]
    assert deltas[-1].usage is not None and deltas[-1].usage.completion_tokens == 6
    assert all(d.usage is None for d in deltas[:-1])


def test_n_choices_are_kept_apart_by_index(client: Client) -> None:
    result = client.generate("hi", n=3, max_tokens=4)
    assert [c.index for c in result.choices] == [0, 1, 2]
    assert [c.text for c in result.choices] == [expected(4, i) for i in range(3)]
    # The prompt counts once; completions add up over choices.
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (1, 12)


def test_stream_with_n_ends_after_every_choice_finished(client: Client) -> None:
    deltas = list(client.generate("hi", stream=True, n=2, max_tokens=3))
    for i in range(2):
        mine = [d for d in deltas if d.index == i]
        assert "".join(d.text for d in mine) == expected(3, i)
        assert mine[-1].finish_reason == "length"


def test_logprobs_carry_token_texts_and_alternatives(client: Client) -> None:
    result = client.generate("hi", max_tokens=3, logprobs=2)
    entries = result.choices[0].logprobs
    assert entries is not None and len(entries) == 3
    assert [e.token for e in entries] == [token_text(k, 0) for k in range(3)]
    assert [e.logprob for e in entries] == [0.0, -0.25, -0.5]
    assert [len(e.top) for e in entries] == [2, 2, 2]
    assert entries[1].top[1].token == "alt1" and entries[1].top[1].logprob == -1.25


def test_messages_and_token_ids_reach_the_engine(client: Client, engine: FakeEngine) -> None:
    messages = [{"role": "user", "content": "a b"}]
    client.generate(messages, max_tokens=1)
    assert engine.requests[-1].messages == messages
    result = client.generate([5, 6, 7], max_tokens=1)
    sent = engine.requests[-1].input_ids
    assert sent is not None and sent.dtype == np.int32 and sent.tolist() == [5, 6, 7]
    assert result.usage.prompt_tokens == 3


def test_token_ids_are_checked_only_for_what_the_message_can_hold(client: Client,
                                                                  engine: FakeEngine) -> None:
    """Whether an id is in the vocabulary is the engine's to judge (scheduler admission);
    the client refuses only ids that an int32 array cannot carry."""
    client.generate([5, -1], max_tokens=1)
    assert engine.requests[-1].input_ids.tolist() == [5, -1]
    before = len(engine.requests)
    with pytest.raises(BadRequestError) as info:
        client.generate([5, 2**31], max_tokens=1)
    assert info.value.param == "input_ids" and "32-bit" in info.value.message
    assert len(engine.requests) == before


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -1.0}, "temperature"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"n": 99}, "n"),
    # the field a grammar came from, not the first word of its message ("regex:")
    ({"grammar": GrammarSpec("regex", "", "regex")}, "regex"),
])
def test_bad_sampling_is_refused_before_sending(client: Client, engine: FakeEngine,
                                                kwargs: dict, field: str) -> None:
    before = len(engine.requests)
    with pytest.raises(BadRequestError) as info:
        client.generate("hi", **kwargs)
    assert info.value.status == 400 and info.value.param == field
    assert field in info.value.message
    assert len(engine.requests) == before


def test_unknown_sampling_name_says_which(client: Client) -> None:
    with pytest.raises(BadRequestError, match="temprature"):
        client.generate("hi", temprature=0.5)


def test_exactly_one_input_form(client: Client) -> None:
    with pytest.raises(BadRequestError, match="exactly one"):
        client.generate()
    with pytest.raises(BadRequestError, match="exactly one"):
        client.generate("hi", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(BadRequestError, match="input_ids"):
        client.generate(input_ids=[2**40, 2])


def test_status_reports_every_process(client: Client) -> None:
    status = client.status()
    assert status.ready
    assert {"tokenizer", "scheduler", "worker0", "detokenizer"} <= set(status.processes)
