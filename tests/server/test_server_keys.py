"""API keys on a real server: from a file and the environment, never in its argv or the run's
config.json; per-key request and token limits answer 429 with Retry-After."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.harness import ServerUnderTest, check_error_body

CHAT = "/v1/chat/completions"
KEYS = "sk-slow rpm=2 name=slow\nsk-thin tpm=12 name=thin\nsk-free name=free\n"


@pytest.fixture(scope="module")
def keyed() -> Iterator[ServerUnderTest]:
    folder = Path(tempfile.mkdtemp(prefix="tsk-"))
    keys = folder / "keys"
    keys.write_text(KEYS)
    keys.chmod(0o600)
    srv = ServerUnderTest(api_key="sk-from-env", api_key_file=str(keys))
    yield srv
    srv.stop()


def ask(srv: ServerUnderTest, key: str | None, max_tokens: int = 2,
        path: str = CHAT) -> tuple[int, dict[str, str], bytes]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"messages": [{"role": "user", "content": "one two three"}],
            "max_tokens": max_tokens} if path == CHAT else None
    return srv.request("POST" if body else "GET", path, body, headers=headers)


def test_keys_come_from_the_file_and_the_environment_only(keyed: ServerUnderTest) -> None:
    assert ask(keyed, None)[0] == 401
    assert ask(keyed, "sk-wrong")[0] == 401
    assert ask(keyed, "sk-free")[0] == 200
    assert ask(keyed, "sk-from-env")[0] == 200
    secrets = ("sk-free", "sk-from-env", "sk-slow")
    config = Path(keyed.paths.config_file).read_text()
    cmdline = Path(f"/proc/{keyed.proc.pid}/cmdline").read_bytes().decode()
    assert not any(s in config or s in cmdline for s in secrets)


def test_requests_per_minute_per_key(keyed: ServerUnderTest) -> None:
    assert [ask(keyed, "sk-slow")[0] for _ in range(2)] == [200, 200]
    status, headers, body = ask(keyed, "sk-slow")
    assert status == 429 and 1 <= int(headers["retry-after"]) <= 30
    err = check_error_body(body, 429)
    assert "'slow'" in err["message"] and "2 requests per minute" in err["message"]
    assert ask(keyed, "sk-free")[0] == 200  # another key is not held back
    # Every route that runs the model counts against the key: /health_generate (HEAD too,
    # which aiohttp answers with the GET handler) and /v1/embeddings.
    assert ask(keyed, "sk-slow", path="/health_generate")[0] == 429
    slow = {"Authorization": "Bearer sk-slow"}
    assert keyed.request("HEAD", "/health_generate", headers=slow)[0] == 429
    assert keyed.request("POST", "/v1/embeddings", {"input": "one two"}, headers=slow)[0] == 429
    _, _, metrics = keyed.request("GET", "/metrics")
    assert b'tessera:rate_limited_requests_total{key="slow"} 4.0' in metrics


def test_tokens_per_minute_per_key(keyed: ServerUnderTest) -> None:
    # The fake engine counts 3 prompt tokens ("one two three") and max_tokens outputs.
    assert ask(keyed, "sk-thin", max_tokens=8)[0] == 200  # 11 of 12 tokens: admitted
    assert ask(keyed, "sk-thin", max_tokens=8)[0] == 200  # in credit still: now 10 in debt
    status, headers, body = ask(keyed, "sk-thin")
    assert status == 429 and int(headers["retry-after"]) >= 50  # 11 tokens at 0.2 a second
    assert "12 tokens per minute" in check_error_body(body, 429)["message"]
