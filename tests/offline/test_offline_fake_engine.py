"""The offline API's request handling against the client library's FakeEngine (real sockets,
no model): ordering, per-prompt sampling, streaming timings, errors."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.bus.messages import SamplingParams
from tessera.bus.run_paths import RunPaths
from tessera.client.errors import TesseraError
from tessera.client.testing import FakeEngine
from tessera.offline import LLM, Engine, normalize_prompts, per_request


@pytest.fixture
def fake(run_root: Path) -> Iterator[FakeEngine]:
    paths = RunPaths.create(str(run_root / "run"))
    with FakeEngine(paths, token_delay_s=0.001, reply_len=6) as engine:
        yield engine


def test_normalize_prompts_forms() -> None:
    assert normalize_prompts("hi") == ["hi"]
    assert normalize_prompts([1, 2, 3]) == [[1, 2, 3]]
    assert normalize_prompts([[1, 2], [3]]) == [[1, 2], [3]]
    msgs = [{"role": "user", "content": "x"}]
    assert normalize_prompts(msgs) == [msgs]
    assert normalize_prompts(["a", "b"]) == ["a", "b"]
    with pytest.raises(ValueError):
        normalize_prompts([])
    with pytest.raises(ValueError, match="one per prompt"):
        per_request([SamplingParams()] * 2, 3)


def test_llm_generate_in_order_with_per_prompt_params(fake: FakeEngine) -> None:
    with LLM(connect_to=fake.paths.run_dir) as llm:
        outs = llm.generate(["first", [5, 6, 7], "third"],
                            [SamplingParams(max_tokens=2), {"max_tokens": 4},
                             SamplingParams(max_tokens=6)], use_tqdm=False)
    assert [o.completion_tokens for o in outs] == [2, 4, 6]
    assert [len(o.token_ids) for o in outs] == [2, 4, 6]
    assert outs[0].text == "w0 w1"
    assert outs[0].finish_reason == "length"
    assert all(o.e2e_s > 0 for o in outs)
    assert len(fake.requests) == 3
    assert fake.requests[1].input_ids is not None
    assert fake.requests[1].input_ids.tolist() == [5, 6, 7]


def test_llm_stream_records_token_times(fake: FakeEngine) -> None:
    seen: list[int] = []
    with LLM(connect_to=fake.paths.run_dir) as llm:
        outs = llm.generate("hello", SamplingParams(max_tokens=5), stream=True, use_tqdm=False,
                            on_result=lambda i, r: seen.append(i))
    (out,) = outs
    assert seen == [0]
    assert len(out.token_times) == 5
    assert out.ttft_s == out.token_times[0]
    assert len(out.itl_s) == 4 and all(x >= 0 for x in out.itl_s)
    assert out.token_times == sorted(out.token_times)


def test_llm_error_is_raised(fake: FakeEngine) -> None:
    with LLM(connect_to=fake.paths.run_dir) as llm, pytest.raises(TesseraError):
        llm.generate(["ok", "FAIL_400"], use_tqdm=False)


def test_engine_async_generate_and_stream(fake: FakeEngine) -> None:
    async def main() -> tuple[int, list[str]]:
        async with Engine(connect_to=fake.paths.run_dir) as engine:
            res = await engine.generate("x", SamplingParams(max_tokens=3))
            texts = [d.text async for d in engine.stream("y", {"max_tokens": 2})]
            return res.completion_tokens, texts

    count, texts = asyncio.run(main())
    assert count == 3
    assert "".join(texts) == "w0 w1"


def test_llm_prefills_whole_chunks_unless_told_otherwise(fake: FakeEngine) -> None:
    """The blocking LLM's steps carry whole prefill chunks beside decodes (no stream waits on
    its next token); an argument given wins, and the async Engine keeps serving's default."""
    from tessera.config import EngineConfig

    served = EngineConfig(model="default").max_mixed_step_ratio
    assert served > 1
    with LLM(connect_to=fake.paths.run_dir) as llm:
        assert llm.config.max_mixed_step_ratio == 0.0
    with LLM(connect_to=fake.paths.run_dir, max_mixed_step_ratio=2.5) as llm:
        assert llm.config.max_mixed_step_ratio == 2.5
    engine = Engine(connect_to=fake.paths.run_dir)
    try:
        assert engine.config.max_mixed_step_ratio == served
    finally:
        engine.shutdown()
