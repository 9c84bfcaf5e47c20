"""What applications call, end to end: `tessera serve` on the default model (with the qwen3
reasoning parser), the official openai client. Structured output over many seeds at
temperature 1, regex and choice constraints, tool calls (auto, required, named, parallel,
streamed) that parse and go back into the conversation, logit_bias, an unknown field, and
the reasoning split. Slow (loads a model)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import pytest

from tests.server.test_e2e import Serve

pytestmark = [pytest.mark.integration, pytest.mark.slow]
openai = pytest.importorskip("openai")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "address": {"type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 12},
                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"]},
    },
    "required": ["name", "age", "role", "tags", "address"],
}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "maxLength": 16},
                                      "unit": {"enum": ["c", "f"]}},
                       "required": ["city", "unit"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time in a time zone",
        "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET", "PST"]}},
                       "required": ["tz"]}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris and the time in UTC?"}]


@pytest.fixture(scope="module")
def serve() -> Iterator[Serve]:
    srv = Serve("--reasoning-parser", "qwen3")
    yield srv
    assert srv.stop() == 0, srv.tail()


@pytest.fixture(scope="module")
def oai(serve: Serve) -> Any:
    return openai.OpenAI(base_url=serve.url + "/v1", api_key="unused", max_retries=0,
                         timeout=600)


def _chat(oai: Any, **kw: Any) -> Any:
    kw.setdefault("messages", ASK)
    kw.setdefault("max_tokens", 160)
    return oai.chat.completions.create(model="default", **kw)


def _check_calls(calls: list[Any]) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_nested_json_schema_holds_over_20_seeds_at_temperature_1(oai: Any) -> None:
    fmt = {"type": "json_schema",
           "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    messages = [{"role": "user", "content": "Invent a person and describe them as JSON."}]

    def one(seed: int) -> Any:
        return _chat(oai, messages=messages, response_format=fmt, temperature=1.0, seed=seed,
                     max_tokens=300)

    with ThreadPoolExecutor(20) as pool:  # concurrent: the engine batches them
        replies = list(pool.map(one, range(20)))
    texts = set()
    for r in replies:
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), PERSON)
        texts.add(choice.message.content)
    assert len(texts) > 1  # temperature 1 really sampled


def test_json_object_regex_and_choice(oai: Any) -> None:
    r = _chat(oai, response_format={"type": "json_object"}, temperature=1.0, seed=3,
              max_tokens=200)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    pattern = r"(red|green|blue)-[0-9]{2,3}"
    for field in ("regex", "guided_regex"):
        r = _chat(oai, extra_body={field: pattern}, temperature=1.0, seed=5)
        assert re.fullmatch(pattern, r.choices[0].message.content), r.choices[0].message
        assert r.choices[0].finish_reason == "stop"
    choices = ["alpha", "beta gamma", 'quote " and \\ slash']
    for seed in range(4):
        r = _chat(oai, extra_body={"guided_choice": choices}, temperature=1.0, seed=seed)
        assert r.choices[0].message.content in choices


def test_required_named_and_parallel_tool_calls(oai: Any) -> None:
    r = _chat(oai, tools=TOOLS, tool_choice="required", temperature=0)
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.content is None
    _check_calls(r.choices[0].message.tool_calls)
    named = {"type": "function", "function": {"name": "get_time"}}
    r = _chat(oai, tools=TOOLS, tool_choice=named, temperature=1.0, seed=1)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_time" and r.choices[0].finish_reason == "stop"
    _check_calls([call])
    seeds = range(12)

    def free(seed: int) -> Any:
        # 120 tokens hold an answer of several calls (the longest whole one of these seeds
        # is 77); the seeds that keep adding calls are cut there, not at 300 (60 s of steps)
        return _chat(oai, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed,
                     max_tokens=120)

    def single(seed: int) -> Any:
        return _chat(oai, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                     temperature=1.0, seed=seed)

    with ThreadPoolExecutor(2 * len(seeds)) as pool:  # concurrent: the engine batches them
        frees = pool.map(free, seeds)
        singles = pool.map(single, seeds)
        replies = list(zip(frees, singles, strict=True))
    counts = []
    for r, one in replies:
        if r.choices[0].finish_reason == "length":
            # at temperature 1 a model may keep adding calls: the array is cut, not broken
            assert r.choices[0].message.content.startswith("[")
            continue
        _check_calls(r.choices[0].message.tool_calls)
        counts.append(len(r.choices[0].message.tool_calls))
        assert len(one.choices[0].message.tool_calls) == 1
        _check_calls(one.choices[0].message.tool_calls)
    assert len(counts) >= 6 and max(counts) >= 2, counts  # parallel calls in one answer


def _hermes_call(tz: str) -> str:
    # Forces the model to write a call in its template's own format (Hermes for the default
    # model): the `auto` path must then find it in the text.
    return (r'I will check\. <tool_call>\n\{"name": "get_time", "arguments": \{"tz": "' + tz +
            r'"\}\}\n</tool_call>')


def test_auto_tool_calls_are_parsed_whole_and_streamed(oai: Any) -> None:
    r = _chat(oai, tools=TOOLS, extra_body={"regex": _hermes_call("CET")}, temperature=0)
    message = r.choices[0].message
    assert message.content == "I will check. " and r.choices[0].finish_reason == "tool_calls"
    (call,) = message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_time",
                                                                          {"tz": "CET"})
    # Plain answers under tool_choice auto stay plain text.
    plain = _chat(oai, tools=TOOLS, extra_body={"regex": "No tools needed\\."}, temperature=0)
    assert plain.choices[0].message.content == "No tools needed." and \
        not plain.choices[0].message.tool_calls
    for extra, want in (({"regex": _hermes_call("PST")}, {"tz": "PST"}), (None, None)):
        kwargs: dict[str, Any] = {"extra_body": extra} if extra else {
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
        chunks = list(_chat(oai, tools=TOOLS, stream=True, temperature=0, **kwargs))
        calls: dict[int, dict[str, str]] = {}
        for chunk in chunks:
            for tc in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                slot = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": ""})
                slot["id"] += tc.id or ""
                slot["name"] += (tc.function.name or "") if tc.function else ""
                slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
        (only,) = calls.values()
        assert only["id"].startswith("call_")
        args = json.loads(only["arguments"])
        if want is not None:
            assert only["name"] == "get_time" and args == want
        else:
            assert only["name"] == "get_weather"
            jsonschema.validate(args, PARAMS["get_weather"])
            assert len([c for c in chunks if c.choices and c.choices[0].delta.tool_calls]) > 2
        assert chunks[-1].choices[0].finish_reason == ("tool_calls" if want else "stop")


def test_tool_calls_round_trip_through_the_conversation(oai: Any) -> None:
    r = _chat(oai, tools=TOOLS, tool_choice="required", temperature=0)
    calls = r.choices[0].message.tool_calls
    history = [*ASK, r.choices[0].message.model_dump(exclude_none=True)]
    history += [{"role": "tool", "tool_call_id": c.id, "content": f"result {i}: 21 degrees"}
                for i, c in enumerate(calls)]
    follow = _chat(oai, messages=history, tools=TOOLS, temperature=0, max_tokens=8)
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # the calls and results are in the prompt: it is longer than the question alone
    alone = _chat(oai, tools=TOOLS, temperature=0, max_tokens=1)
    assert follow.usage.prompt_tokens > alone.usage.prompt_tokens + 10 * len(calls)


def test_logit_bias_removes_a_token(oai: Any) -> None:
    messages = [{"role": "user", "content": "Say hello."}]
    plain = _chat(oai, messages=messages, temperature=0, max_tokens=6, logprobs=True)
    first = plain.choices[0].logprobs.content[0].token
    from tessera.formats.tokenizer import load_tokenizer

    ids = load_tokenizer("default").encode(first, add_special_tokens=False)
    assert len(ids) == 1, (first, ids)
    banned = _chat(oai, messages=messages, temperature=0, max_tokens=6, logprobs=True,
                   logit_bias={str(ids[0]): -100})
    tokens = [t.token for t in banned.choices[0].logprobs.content]
    assert first not in tokens, (first, tokens)


def test_an_unknown_field_is_refused(oai: Any) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _chat(oai, extra_body={"guided_decoding_backend": "outlines"})
    assert "guided_decoding_backend" in str(info.value)


def test_reasoning_goes_to_reasoning_content(oai: Any) -> None:
    # The default model is no reasoning model: a grammar makes it write like one.
    shape = {"regex": r"<think>\nLet me see[a-z ,]{0,20}\.\n</think>\n\nThe answer is [0-9]\."}
    r = _chat(oai, extra_body=shape, temperature=0)
    message = r.choices[0].message
    assert message.reasoning_content.startswith("\nLet me see")
    assert re.fullmatch(r"The answer is [0-9]\.", message.content)
    chunks = list(_chat(oai, extra_body=shape, temperature=0, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thought = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    said = "".join(d.content or "" for d in deltas)
    assert (thought, said) == (message.reasoning_content, message.content)


def test_echo_with_logprobs_and_max_tokens_0_scores_the_prompt(oai: Any) -> None:
    text = "The capital of France is Paris."
    r = oai.completions.create(model="default", prompt=text, max_tokens=0, echo=True,
                               logprobs=2)
    choice = r.choices[0]
    assert choice.text == text and choice.finish_reason == "length"
    lp = choice.logprobs
    assert len(lp.tokens) == r.usage.prompt_tokens and r.usage.completion_tokens == 0
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x <= 0 for x in lp.token_logprobs[1:])
    assert all(len(top) == 2 for top in lp.top_logprobs[1:])
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    # echo with logprobs and generation: the prompt's entries, then the new tokens'
    r = oai.completions.create(model="default", prompt=text, max_tokens=3, echo=True,
                               logprobs=0, temperature=0)
    assert r.choices[0].text.startswith(text)
    assert len(r.choices[0].logprobs.tokens) == r.usage.prompt_tokens + 3
    with pytest.raises(openai.BadRequestError, match="echo"):
        oai.completions.create(model="default", prompt=text, max_tokens=0)


def test_embeddings(oai: Any) -> None:
    import numpy as np

    texts = ["Paris is in France.", "The cat sat on the mat.", "Paris is in France."]
    r = oai.embeddings.create(model="default", input=texts)  # the client asks for base64
    vectors = [np.asarray(d.embedding) for d in r.data]
    assert [d.index for d in r.data] == [0, 1, 2] and r.usage.prompt_tokens > 0
    assert all(v.shape == vectors[0].shape and abs(np.linalg.norm(v) - 1) < 1e-4
               for v in vectors)
    np.testing.assert_allclose(vectors[0], vectors[2], atol=1e-5)
    assert float(vectors[0] @ vectors[1]) < 0.999
    plain = oai.embeddings.create(model="default", input=texts[1], encoding_format="float")
    np.testing.assert_allclose(np.asarray(plain.data[0].embedding), vectors[1], atol=1e-5)
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        oai.embeddings.create(model="default", input="x", dimensions=8)
