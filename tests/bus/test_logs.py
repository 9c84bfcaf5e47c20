"""Every log line names its process and, while a request is handled, the request's id: as
text, or as one JSON object per line (`--log-format json`)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator

import pytest

from tessera.bus.logs import CURRENT_RID, setup_logging


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line]


def test_json_lines_carry_process_pid_and_request_id(
        capsys: pytest.CaptureFixture[str], restore_logging: None) -> None:
    setup_logging("info", "scheduler", "json")
    log = logging.getLogger("tessera.test")
    log.info("no request here")
    token = CURRENT_RID.set("chatcmpl-7")
    try:
        log.info("request %s done", "x", extra={"prompt_tokens": 12})
    finally:
        CURRENT_RID.reset(token)
    log.debug("below the level")
    first, second = (json.loads(line) for line in _lines(capsys))
    assert first["process"] == second["process"] == "scheduler"
    assert first["pid"] == os.getpid() and first["level"] == "INFO"
    assert "rid" not in first and first["message"] == "no request here"
    assert second["rid"] == "chatcmpl-7" and second["message"] == "request x done"
    assert second["prompt_tokens"] == 12 and second["logger"] == "tessera.test"


def test_text_lines_name_the_process_and_the_request(
        capsys: pytest.CaptureFixture[str], restore_logging: None) -> None:
    setup_logging("info", "worker1", "text")
    log = logging.getLogger("tessera.test")
    log.warning("plain")
    log.warning("with an explicit id", extra={"rid": "r-9"})
    plain, tagged = _lines(capsys)
    assert f" worker1[{os.getpid()}] WARNING tessera.test: plain" in plain
    assert plain.endswith(": plain") and "rid=" not in plain
    assert tagged.endswith(": rid=r-9 with an explicit id")
