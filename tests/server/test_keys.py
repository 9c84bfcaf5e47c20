"""API keys from a file or the environment, and their per-key token buckets (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.server.errors import ApiError
from tessera.server.keys import ApiKey, KeyFileError, find_key, load_keys
from tessera.server.ratelimit import RateLimiter


def keyfile(tmp_path: Path, text: str) -> str:
    path = tmp_path / "keys"
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


def test_a_key_file_with_limits_names_and_comments(tmp_path: Path) -> None:
    path = keyfile(tmp_path, "# team keys\nsk-a rpm=60 tpm=1000 name=team-a\n\nsk-b  # no limits\n")
    keys = load_keys(path, "sk-env", default_rpm=5, default_tpm=0)
    assert [(k.name, k.rpm, k.tpm) for k in keys] == [("team-a", 60, 1000), ("key4", 5, 0),
                                                      ("env", 5, 0)]
    assert find_key(keys, "Bearer sk-b") is keys[1]
    assert find_key(keys, "bearer sk-env") is keys[2]
    assert find_key(keys, "Bearer sk-c") is None and find_key(keys, "sk-a") is None
    assert "sk-a" not in repr(keys)  # only a digest is kept


@pytest.mark.parametrize("text, words", [
    ("sk-a rpm=fast\n", "whole number"),
    ("sk-a burst=3\n", "is not rpm=N"),
    ("# only comments\n", "holds no key"),
    ("sk-a name=x\nsk-b name=x\n", "share a name"),
])
def test_bad_key_files_are_refused_with_the_line(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(KeyFileError, match=words):
        load_keys(keyfile(tmp_path, text), None)


def test_no_file_and_no_environment_means_no_keys(tmp_path: Path) -> None:
    assert load_keys(None, None) == []
    with pytest.raises(KeyFileError, match="cannot read"):
        load_keys(str(tmp_path / "missing"), None)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_requests_per_minute_refill_over_the_minute() -> None:
    clock = Clock()
    limiter = RateLimiter(clock)
    key = ApiKey("a", b"", rpm=2)
    limiter.admit(key)
    limiter.admit(key)
    with pytest.raises(ApiError) as info:
        limiter.admit(key)
    assert info.value.status == 429 and info.value.retry_after == 30  # one request per 30 s
    assert "2 requests per minute" in info.value.message
    clock.now += 30
    limiter.admit(key)
    limiter.admit(ApiKey("b", b"", rpm=2))  # keys count apart


def test_tokens_per_minute_are_charged_after_the_fact() -> None:
    clock = Clock()
    limiter = RateLimiter(clock)
    key = ApiKey("a", b"", tpm=600)  # 10 tokens a second
    limiter.admit(key)
    limiter.charge(key, 900)  # a big answer: 300 tokens in debt
    with pytest.raises(ApiError) as info:
        limiter.admit(key)
    assert info.value.retry_after == 31 and "600 tokens per minute" in info.value.message
    clock.now += 31
    limiter.admit(key)
    limiter.admit(ApiKey("free", b""))  # no limits: never refused
