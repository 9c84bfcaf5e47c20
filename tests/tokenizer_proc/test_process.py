"""The tokenizer processes over real sockets: valid requests reach the scheduler tokenized,
bad ones are answered at reply_to with their status, and the processes keep serving."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from tessera.bus.channel import Outbox
from tessera.bus.messages import (
    AbortRequest,
    ErrorReply,
    GenerateRequest,
    Heartbeat,
    SamplingParams,
    TokenizedRequest,
)
from tests.tokenizer_proc.procs import Engine, wait_for

pytestmark = pytest.mark.integration

CONTEXT = 64


@pytest.fixture(scope="module")
def engine():
    root = Path(tempfile.mkdtemp(prefix="tsr-"))  # short: ipc paths are limited to 107 bytes
    eng = Engine(root, tokenizer_workers=2, context_length=CONTEXT)
    try:
        eng.start(*[("tessera.tokenizer_proc", f"tokenizer{i}", ["--index", str(i)])
                    for i in range(2)])
        eng.outboxes = [Outbox(eng.paths.tokenizer_endpoint(i)) for i in range(2)]
        yield eng
    finally:
        for box in getattr(eng, "outboxes", []):
            box.close()
        eng.stop()
        shutil.rmtree(root, ignore_errors=True)


def send(engine, worker=0, **kw):
    msg = GenerateRequest(reply_to=engine.client.endpoint, **kw)
    engine.outboxes[worker].send(msg)
    return msg


def test_prompt_and_chat_reach_the_scheduler_tokenized(engine, tokenizer):
    text = "Grüße aus 東京 🗼 — cafe\u0301"
    send(engine, rid="p1", prompt=text, sampling=SamplingParams(max_tokens=4, stop=("。",)))
    got = wait_for(engine.scheduler, TokenizedRequest, predicate=lambda m: m.rid == "p1")
    assert got.input_ids.tolist() == tokenizer.encode(text)
    assert tokenizer.decode(got.input_ids.tolist()) == text
    assert got.detok.reply_to == engine.client.endpoint and got.detok.stop == ("。",)
    msgs = [{"role": "user", "content": "Say hi 👋"}]
    send(engine, worker=1, rid="c1", messages=msgs)
    got = wait_for(engine.scheduler, TokenizedRequest, predicate=lambda m: m.rid == "c1")
    assert got.input_ids.tolist() == tokenizer.encode(tokenizer.apply_chat_template(msgs),
                                                      add_special_tokens=False)


BAD = [
    ({"prompt": ""}, 400, "prompt is empty"),
    ({"prompt": "x", "sampling": SamplingParams(temperature=-0.5)}, 400, "temperature"),
    ({"prompt": "x", "sampling": SamplingParams(n=0)}, 400, "n must be"),
    ({"prompt": "x", "sampling": SamplingParams(logprobs=50)}, 400, "logprobs"),
    ({"prompt": "x", "sampling": SamplingParams(stop=("",))}, 400, "stop"),
    ({"input_ids": np.array([5, 10**6], np.int32)}, 400, "outside the vocabulary"),
    ({"messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    ({"prompt": "x", "messages": [{"role": "user", "content": "y"}]}, 400, "exactly one"),
    ({"input_ids": np.arange(CONTEXT + 1, dtype=np.int32)}, 413,
     f"context length of {CONTEXT}"),
]


@pytest.mark.parametrize("worker", [0, 1])
def test_each_bad_input_is_answered_and_service_goes_on(engine, tokenizer, worker):
    for k, (fields, status, text) in enumerate(BAD):
        rid = f"bad{worker}-{k}"
        send(engine, worker, rid=rid, **fields)
        err = wait_for(engine.client, ErrorReply, predicate=lambda m, rid=rid: m.rid == rid)
        assert err.status == status and text in err.message, (fields, err)
        # still serving: a good request right after goes through
        send(engine, worker, rid=f"ok-{rid}", prompt="fine")
        ok = wait_for(engine.scheduler, TokenizedRequest,
                      predicate=lambda m, rid=rid: m.rid == f"ok-{rid}")
        assert ok.input_ids.tolist() == tokenizer.encode("fine")
    assert engine.alive()
    # no bad request ever reached the scheduler
    assert not any(getattr(m, "rid", "").startswith("bad")
                   for m in engine.scheduler.seen + engine.scheduler.drain(0.2))


def test_abort_is_forwarded(engine):
    engine.outboxes[1].send(AbortRequest(rid="gone", reason="client disconnected"))
    got = wait_for(engine.scheduler, AbortRequest)
    assert got == AbortRequest(rid="gone", reason="client disconnected")


def test_context_fit_is_the_scheduler_s(engine, tokenizer):
    """max_tokens=None ("until the context or the KV pool is full") and a prompt plus
    max_tokens past the context travel on: the scheduler, which knows the worker's context
    and pool, is the one place that judges the fit."""
    send(engine, rid="fill", prompt="count", sampling=SamplingParams(max_tokens=None))
    got = wait_for(engine.scheduler, TokenizedRequest, predicate=lambda m: m.rid == "fill")
    assert got.sampling.max_tokens is None
    send(engine, rid="over", input_ids=np.arange(60, dtype=np.int32),
         sampling=SamplingParams(max_tokens=10))
    got = wait_for(engine.scheduler, TokenizedRequest, predicate=lambda m: m.rid == "over")
    assert got.sampling.max_tokens == 10


def test_a_huge_prompt_is_refused_without_starving_the_heartbeat(engine):
    """8 MB of text (beyond any HTTP limit, sent on the bus directly): answered 413 at once,
    and the process's heartbeats never pause as long as the supervisor's timeout."""
    sent = time.time()
    send(engine, rid="huge", prompt="hello world " * 699_050)
    err = wait_for(engine.client, ErrorReply, timeout=60.0, predicate=lambda m: m.rid == "huge")
    assert err.status == 413 and err.param == "prompt"
    time.sleep(3 * engine.config.heartbeat_interval_s)
    beats = sorted(m.time for m in engine.supervisor.seen + engine.supervisor.drain(0.1)
                   if isinstance(m, Heartbeat) and m.process == "tokenizer0" and m.time >= sent)
    gaps = np.diff([sent, *beats])
    assert beats and gaps.max() < engine.config.heartbeat_timeout_s, gaps.max()
    assert engine.alive()


@pytest.mark.parametrize("reply_to", ["garbage", "tcp://[::1", "ipc://"])
def test_a_reply_to_that_is_no_endpoint_does_not_kill_the_tokenizer(engine, reply_to):
    """Such a client cannot be answered: it is gone, like a client that left."""
    for worker in (0, 1):
        engine.outboxes[worker].send(GenerateRequest(rid=f"nowhere{worker}", reply_to=reply_to,
                                                     prompt=""))
        send(engine, worker, rid=f"after-{reply_to}-{worker}", prompt="fine")
        wait_for(engine.scheduler, TokenizedRequest,
                 predicate=lambda m, w=worker: m.rid == f"after-{reply_to}-{w}")
    assert engine.alive()
