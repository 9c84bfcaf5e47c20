"""Hostile traffic on the bus (every message type, fields holding anything, undecodable
frames) sent to the real tokenizer and detokenizer processes: none dies, and both still serve
a valid request afterwards (Shutdown aside: asking a process to stop is what it is for).
Bounded: a few hundred messages."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings

from tessera.bus.channel import Outbox
from tessera.bus.messages import (
    MESSAGE_TYPES,
    GenerateRequest,
    RequestOutput,
    TokenBatch,
    TokenizedRequest,
)
from tessera.formats.tokenizer import load_tokenizer
from tests.bus.fuzz_frames import hostile_frames
from tests.tokenizer_proc.procs import Engine, wait_for

pytestmark = pytest.mark.integration

FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    root = Path(tempfile.mkdtemp(prefix="tsr-"))  # short: ipc paths are limited to 107 bytes
    eng = Engine(root, context_length=64)
    raw = zmq.Context.instance()
    try:
        eng.start(("tessera.tokenizer_proc", "tokenizer0", ["--index", "0"]),
                  ("tessera.detokenizer_proc", "detokenizer", []))
        eng.raw = {}  # type: ignore[attr-defined]
        for name, endpoint in (("tokenizer", eng.paths.tokenizer),
                               ("detokenizer", eng.paths.detokenizer)):
            sock = raw.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            eng.raw[name] = sock  # type: ignore[attr-defined]
        yield eng
    finally:
        for sock in getattr(eng, "raw", {}).values():
            sock.close()
        eng.stop()
        shutil.rmtree(root, ignore_errors=True)


OTHERS = sorted(set(MESSAGE_TYPES) - {"Shutdown"})
# What each process is meant to receive comes most often; anything else now and then.
TO_TOKENIZER = ["GenerateRequest"] * 8 + ["AbortRequest"] * 2 + OTHERS
TO_DETOKENIZER = ["TokenBatch"] * 6 + ["ErrorReply"] * 3 + ["ResetRequests"] + OTHERS


def send(engine: Engine, name: str, frames: list[bytes]) -> None:
    engine.raw[name].send_multipart(frames)  # type: ignore[attr-defined]
    assert engine.alive(), [p.returncode for p in engine.procs]


@FUZZ
@given(frames=hostile_frames(TO_TOKENIZER))
def test_hostile_messages_do_not_kill_the_tokenizer(engine: Engine, frames: list[bytes]) -> None:
    send(engine, "tokenizer", frames)


@FUZZ
@given(frames=hostile_frames(TO_DETOKENIZER))
def test_hostile_messages_do_not_kill_the_detokenizer(engine: Engine,
                                                      frames: list[bytes]) -> None:
    send(engine, "detokenizer", frames)


def test_both_still_serve_after_the_fuzz(engine: Engine) -> None:
    tokenizer = load_tokenizer("default")
    assert engine.alive()
    to_tokenizer, to_detok = Outbox(engine.paths.tokenizer), Outbox(engine.paths.detokenizer)
    try:
        to_tokenizer.send(GenerateRequest(rid="after", reply_to=engine.client.endpoint,
                                          prompt="still here"))
        got = wait_for(engine.scheduler, TokenizedRequest, timeout=30.0,
                       predicate=lambda m: m.rid == "after")
        assert got.input_ids.tolist() == tokenizer.encode("still here")
        to_detok.send(TokenBatch(
            rids=["after"], indices=[0], counts=np.array([1], np.int32),
            token_ids=np.array(tokenizer.encode(" ok", add_special_tokens=False)[:1], np.int32),
            finish=["length"], prompt_tokens=[3], cached_tokens=[0],
            new_requests={"after": got.detok}, matched_stop=[None]))
        out = wait_for(engine.client, RequestOutput, timeout=30.0,
                       predicate=lambda m: m.rid == "after")
        assert out.finish_reason == "length" and out.text == " ok"
    finally:
        to_tokenizer.close()
        to_detok.close()
    assert engine.alive()
