"""The server checks a request's sampling parameters once, with the client library's
`check_sampling`, and the engine requests it starts are not checked again in its process
(a completions list of prompts starts several); a bad value is still a 400 naming the field.

The server's app runs in this process here (in front of a FakeEngine), so a spy on
`SamplingParams.validate` counts every check the request path makes in the server process.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tessera.bus.messages import ParamError, SamplingParams
from tessera.bus.run_paths import RunPaths
from tessera.client import AsyncClient
from tessera.client.testing import FakeEngine
from tessera.config import ServerConfig
from tessera.server.app import create_app
from tessera.server.state import ServerState, served_model_ids
from tests.server.harness import BASE_CONFIG

CASES = [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 3}),
    ("/v1/completions", {"prompt": ["a", "b", "c"], "max_tokens": 3, "n": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 3}),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 3}}),
    ("/generate", {"input_ids": [4, 5], "sampling_params": {"max_new_tokens": 3}}),
]
BAD = [
    ("/v1/completions", {"prompt": ["a", "b"], "temperature": -1}, "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "top_p": 2}, "top_p"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": -1}},
     "max_new_tokens"),
    # A SamplingParams name the request did not write is named as the request wrote it.
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ("/v1/completions", {"prompt": "hi", "echo": True, "logprobs": 50}, "logprobs"),
]


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[SamplingParams]:
    """Every SamplingParams that `validate` ran on, in this process."""
    seen: list[SamplingParams] = []
    real = SamplingParams.validate

    def spy(self: SamplingParams) -> ParamError | None:
        seen.append(self)
        return real(self)

    monkeypatch.setattr(SamplingParams, "validate", spy)
    return seen


def _post_all(run_root: Path, calls: list[tuple[str, dict[str, Any]]]
              ) -> list[tuple[int, dict[str, Any]]]:
    """POST each body through the real app, its AsyncClient and the bus to a FakeEngine."""
    paths = RunPaths.create()
    config = ServerConfig(**BASE_CONFIG)

    async def run() -> list[tuple[int, dict[str, Any]]]:
        client = AsyncClient(paths, config, process_name="server")
        state = ServerState(config=config, paths=paths, client=client,
                            model_ids=served_model_ids(config), max_concurrent=8)
        state.ready = True
        http = TestClient(TestServer(create_app(state)))
        await http.start_server()
        out = []
        try:
            for path, body in calls:
                resp = await http.post(path, json=body)
                out.append((resp.status, await resp.json()))
        finally:
            await http.close()
            client.close()
        return out

    with FakeEngine(paths, token_delay_s=0.0, reply_len=2):
        return asyncio.run(run())


@pytest.mark.parametrize(("path", "body"), CASES)
def test_a_request_is_checked_once_in_the_server_process(
        run_root: Path, checks: list[SamplingParams], path: str, body: dict[str, Any]) -> None:
    [(status, answer)] = _post_all(run_root, [(path, body)])
    assert status == 200, answer
    assert len(checks) == 1, f"{len(checks)} checks of {path} {body}"


@pytest.mark.parametrize(("path", "body", "param"), BAD)
def test_a_bad_value_is_a_400_naming_the_field_after_one_check(
        run_root: Path, checks: list[SamplingParams], path: str, body: dict[str, Any],
        param: str) -> None:
    [(status, answer)] = _post_all(run_root, [(path, body)])
    assert status == 400, answer
    assert answer["error"]["param"] == param and param in answer["error"]["message"]
    assert len(checks) == 1
