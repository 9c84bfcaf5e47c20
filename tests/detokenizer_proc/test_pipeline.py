"""Tokenizer and detokenizer processes together, the test standing in for the scheduler: text
in, text out, Unicode intact both ways, stop strings honoured, bad requests answered."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tessera.bus.channel import Outbox
from tessera.bus.messages import (
    AbortRequest,
    ErrorReply,
    GenerateRequest,
    RequestOutput,
    SamplingParams,
    TokenBatch,
    TokenizedRequest,
)
from tests.tokenizer_proc.procs import Engine, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine():
    root = Path(tempfile.mkdtemp(prefix="tsr-"))
    eng = Engine(root)
    try:
        eng.start(("tessera.tokenizer_proc", "tokenizer0", ["--index", "0"]),
                  ("tessera.detokenizer_proc", "detokenizer", []))
        eng.to_tokenizer = Outbox(eng.paths.tokenizer)
        eng.to_detok = Outbox(eng.paths.detokenizer)
        yield eng
    finally:
        for name in ("to_tokenizer", "to_detok"):
            if hasattr(eng, name):
                getattr(eng, name).close()
        eng.stop()
        shutil.rmtree(root, ignore_errors=True)


def answer(engine, req: TokenizedRequest, reply_ids: list[int], finish: str) -> None:
    """Play the scheduler: send `reply_ids` one per step, the first with the detok dict."""
    for k, token in enumerate(reply_ids):
        last = k == len(reply_ids) - 1
        engine.to_detok.send(TokenBatch(
            rids=[req.rid], indices=[0], counts=np.array([1], np.int32),
            token_ids=np.array([token], np.int32), finish=[finish if last else None],
            prompt_tokens=[len(req.input_ids)], cached_tokens=[0],
            new_requests={req.rid: req.detok} if k == 0 else {},
            matched_stop=[token if last and finish == "stop" else None]))


def text_of(engine, rid: str) -> tuple[str, RequestOutput]:
    parts = []
    while True:
        out = wait_for(engine.client, RequestOutput, predicate=lambda m: m.rid == rid)
        parts.append(out.text)
        if out.finish_reason is not None:
            return "".join(parts), out


def test_unicode_round_trip_through_both_processes(engine, tokenizer):
    prompt = [{"role": "user", "content": "Traduis: 你好世界 👋🏽 — Ṩ̈ (e\u0301)"}]
    engine.to_tokenizer.send(GenerateRequest(rid="u", reply_to=engine.client.endpoint,
                                             messages=prompt))
    req = wait_for(engine.scheduler, TokenizedRequest)
    assert "你好世界 👋🏽 — Ṩ̈ (e\u0301)" in tokenizer.decode(req.input_ids.tolist())
    reply = "Bonjour le monde 🌍👋🏽 — 你好 e\u0301!"
    answer(engine, req, tokenizer.encode(reply, add_special_tokens=False) + [2], "stop")
    text, last = text_of(engine, "u")
    assert text == reply and last.finish_reason == "stop"
    assert last.prompt_tokens == len(req.input_ids)


def test_stop_string_from_the_request_is_honoured(engine, tokenizer):
    engine.to_tokenizer.send(GenerateRequest(
        rid="s", reply_to=engine.client.endpoint, prompt="List:", stream=False,
        sampling=SamplingParams(max_tokens=50, stop=("🛑",))))
    req = wait_for(engine.scheduler, TokenizedRequest)
    answer(engine, req, tokenizer.encode(" one, two 🛑 three", add_special_tokens=False),
           "length")
    text, last = text_of(engine, "s")
    assert text == " one, two " and last.finish_reason == "stop"
    assert wait_for(engine.scheduler, AbortRequest).rid == "s"


def test_bad_request_answered_and_next_one_served(engine, tokenizer):
    # a request the tokenizer refuses itself (context fit is the scheduler's rule, and the
    # scheduler here is the test's)
    engine.to_tokenizer.send(GenerateRequest(rid="bad", reply_to=engine.client.endpoint,
                                             prompt="x" * 10, sampling=SamplingParams(
                                                 max_tokens=16, top_p=1.5)))
    err = wait_for(engine.client, ErrorReply)
    assert err.rid == "bad" and err.status == 400 and err.param == "top_p"
    engine.to_tokenizer.send(GenerateRequest(rid="good", reply_to=engine.client.endpoint,
                                             prompt="ok"))
    req = wait_for(engine.scheduler, TokenizedRequest)
    assert req.rid == "good"
    answer(engine, req, tokenizer.encode(" fine", add_special_tokens=False), "length")
    assert text_of(engine, "good")[0] == " fine"
    assert engine.alive()
