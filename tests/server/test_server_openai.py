"""The official openai client against the server (chat, streaming, completions, models)."""

from __future__ import annotations

import openai
import pytest

from tessera.client.testing import token_text
from tests.server.harness import ServerUnderTest

MODEL = "SmolLM2-135M-Instruct"


def words(count: int, index: int = 0) -> str:
    return "".join(token_text(k, index) for k in range(count))


@pytest.fixture(scope="module")
def oai(server: ServerUnderTest) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(oai: openai.OpenAI) -> None:
    assert [m.id for m in oai.models.list()] == [MODEL]
    assert oai.models.retrieve(MODEL).id == MODEL


def test_chat_completion(oai: openai.OpenAI, server: ServerUnderTest) -> None:
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hello there"}]}]
    r = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=3,
                                    temperature=0)
    assert r.object == "chat.completion" and r.model == MODEL and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == words(3)
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 3
    assert r.usage.total_tokens == r.usage.prompt_tokens + 3
    sent = server.engine.requests[-1]
    assert sent.messages == [{"role": "system", "content": "be brief"},
                             {"role": "user", "content": "hello there"}]
    assert sent.sampling.temperature == 0.0 and sent.sampling.max_tokens == 3
    assert sent.add_generation_prompt
    oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=1,
                                extra_body={"add_generation_prompt": False})
    assert not server.engine.requests[-1].add_generation_prompt


def test_chat_without_max_tokens_runs_to_the_natural_stop(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert r.choices[0].message.content == words(8)
    assert r.choices[0].finish_reason == "stop"


def test_streamed_chat_completion(oai: openai.OpenAI) -> None:
    chunks = list(oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == words(8)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8
    assert len({c.id for c in chunks}) == 1


def test_chat_n_and_logprobs(oai: openai.OpenAI, server: ServerUnderTest) -> None:
    r = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                    n=2, max_completion_tokens=2, logprobs=True,
                                    top_logprobs=2, seed=7)
    assert [c.index for c in r.choices] == [0, 1]
    assert [c.message.content for c in r.choices] == [words(2, 0), words(2, 1)]
    content = r.choices[0].logprobs.content
    assert [t.token for t in content] == ["w0", " w1"]
    assert content[1].logprob == -0.25
    assert [t.token for t in content[1].top_logprobs] == [" w1", "alt1"]
    assert content[1].bytes == list(b" w1")
    sampling = server.engine.requests[-1].sampling
    assert (sampling.n, sampling.logprobs, sampling.seed) == (2, 2, 7)


def test_completions_with_batch_prompts_and_logprobs(oai: openai.OpenAI) -> None:
    r = oai.completions.create(model=MODEL, prompt=["a b", "c"], n=2, max_tokens=2,
                               logprobs=1)
    assert r.object == "text_completion"
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == [words(2, 0), words(2, 1)] * 2
    lp = r.choices[1].logprobs
    assert lp.tokens == ["w0.1", " w1.1"] and lp.text_offset == [0, 4]
    assert lp.top_logprobs == [{"w0.1": 0.0}, {" w1.1": -0.25}]
    assert r.usage.prompt_tokens == 3 and r.usage.completion_tokens == 8


def test_completions_default_max_tokens_and_echo(oai: openai.OpenAI,
                                                 server: ServerUnderTest) -> None:
    r = oai.completions.create(model=MODEL, prompt="say", echo=True, max_tokens=2)
    assert r.choices[0].text == "say" + words(2)
    oai.completions.create(model=MODEL, prompt=[1, 2, 3])
    sent = server.engine.requests[-1]
    assert sent.input_ids is not None and sent.input_ids.tolist() == [1, 2, 3]
    assert sent.sampling.max_tokens == 16  # OpenAI's default for completions


def test_streamed_completion(oai: openai.OpenAI) -> None:
    chunks = list(oai.completions.create(model=MODEL, prompt="x", max_tokens=4, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == words(4)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_openai_client_raises_on_errors(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                    temperature=7000)
    assert "temperature" in str(info.value)
    with pytest.raises(openai.BadRequestError) as status_info:
        oai.chat.completions.create(model=MODEL,
                                    messages=[{"role": "user", "content": "FAIL_413"}])
    assert status_info.value.code == "context_length_exceeded"  # as OpenAI answers
