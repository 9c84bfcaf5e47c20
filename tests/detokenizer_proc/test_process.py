"""The detokenizer process over real sockets: TokenBatch in, RequestOutputs at reply_to,
AbortRequest to the scheduler when a stop string ends a request."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tessera.bus.channel import Outbox
from tessera.bus.messages import AbortRequest, DetokInfo, ErrorReply, RequestOutput, TokenBatch
from tests.tokenizer_proc.procs import Engine, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine():
    root = Path(tempfile.mkdtemp(prefix="tsr-"))  # short: ipc paths are limited to 107 bytes
    eng = Engine(root)
    try:
        eng.start(("tessera.detokenizer_proc", "detokenizer", []))
        eng.to_detok = Outbox(eng.paths.detokenizer)
        yield eng
    finally:
        if hasattr(eng, "to_detok"):
            eng.to_detok.close()
        eng.stop()
        shutil.rmtree(root, ignore_errors=True)


def detok(engine, **kw):
    values = {"reply_to": engine.client.endpoint, "stream": True, "n": 1, "stop": (),
              "skip_special_tokens": True, "logprobs": None, "prompt_tokens": 5,
              "stop_token_ids": (2,), **kw}
    values["stop"] = tuple(values["stop"])
    return DetokInfo(**values)


def one_token_batches(engine, rid, ids, info, last_finish):
    for k, t in enumerate(ids):
        last = k == len(ids) - 1
        engine.to_detok.send(TokenBatch(
            rids=[rid], indices=[0], counts=np.array([1], np.int32),
            token_ids=np.array([t], np.int32), finish=[last_finish if last else None],
            prompt_tokens=[5], cached_tokens=[0], new_requests={rid: info} if k == 0 else {},
            matched_stop=[t if last and last_finish == "stop" else None]))


def collect(engine, rid):
    outs = []
    while not outs or outs[-1].finish_reason is None:
        outs.append(wait_for(engine.client, RequestOutput, predicate=lambda m: m.rid == rid))
    return outs


def test_streamed_unicode_survives(engine, tokenizer):
    text = "日本語のテキスト 🎌 with emoji 👩‍💻 and combining a\u0308o\u0308"
    ids = tokenizer.encode(text, add_special_tokens=False) + [2]
    one_token_batches(engine, "u1", ids, detok(engine), "stop")
    outs = collect(engine, "u1")
    assert "".join(o.text for o in outs) == text
    assert all("\ufffd" not in o.text for o in outs)
    assert outs[-1].finish_reason == "stop" and outs[-1].completion_tokens == len(ids)
    assert outs[-1].prompt_tokens == 5


def test_stop_string_cuts_and_aborts_at_the_scheduler(engine, tokenizer):
    ids = tokenizer.encode("First line.\nUser: next question", add_special_tokens=False)
    one_token_batches(engine, "s1", ids, detok(engine, stop=["\nUser:"], stream=False),
                      "length")
    [out] = collect(engine, "s1")
    assert out.text == "First line." and out.finish_reason == "stop"
    assert wait_for(engine.scheduler, AbortRequest) == AbortRequest(rid="s1", reason="stop")


def test_error_reply_reaches_the_client(engine):
    engine.to_detok.send(ErrorReply(rid="e1", status=503, message="worker died",
                                    error_type="server_error", reply_to=engine.client.endpoint))
    err = wait_for(engine.client, ErrorReply, predicate=lambda m: m.rid == "e1")
    assert err.status == 503 and err.message == "worker died"


def test_gone_client_aborts(engine):
    gone = engine.paths.client_endpoint()  # nobody listens there
    engine.to_detok.send(TokenBatch(
        rids=["g1"], indices=[0], counts=np.array([1], np.int32),
        token_ids=np.array([100], np.int32), finish=[None], prompt_tokens=[5],
        cached_tokens=[0], new_requests={"g1": detok(engine, reply_to=gone)}))
    got = wait_for(engine.scheduler, AbortRequest, predicate=lambda m: m.rid == "g1")
    assert got.reason == "client_gone"
    assert engine.alive()
