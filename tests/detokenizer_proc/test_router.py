"""The detokenizer's routing: deltas per request, stop strings, finishes, errors, gone clients."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.bus.channel import SendTimeout
from tessera.bus.messages import (
    AbortRequest,
    DetokInfo,
    ErrorReply,
    RequestOutput,
    RequestOutputBatch,
    ResetRequests,
    TokenBatch,
)
from tessera.bus.output_batch import unpack_outputs
from tessera.detokenizer_proc.router import Router

EOS = 2


def detok(**kw):
    base = {"reply_to": "ipc://client", "stream": True, "n": 1, "stop": (),
            "skip_special_tokens": True, "logprobs": None, "prompt_tokens": 7,
            "stop_token_ids": ()}
    merged = {**base, **kw}
    merged["stop"] = tuple(merged["stop"])
    return DetokInfo(**merged)


def batch(rows, new=None, logprobs=None, top_ids=None, top_logprobs=None):
    """rows: (rid, index, [tokens], finish)"""
    kw = {}
    if logprobs is not None:
        kw = {"logprobs": np.asarray(logprobs, np.float32),
              "top_ids": np.asarray(top_ids, np.int32),
              "top_logprobs": np.asarray(top_logprobs, np.float32)}
    return TokenBatch(
        rids=[r[0] for r in rows], indices=[r[1] for r in rows],
        counts=np.array([len(r[2]) for r in rows], np.int32),
        token_ids=np.array([t for r in rows for t in r[2]], np.int32),
        finish=[r[3] for r in rows], prompt_tokens=[7] * len(rows),
        cached_tokens=[3] * len(rows), new_requests=new or {},
        matched_stop=[EOS if r[3] == "stop" else None for r in rows], **kw)


class Harness:
    def __init__(self, tokenizer, gone=()):
        self.replies: list[tuple[str, object]] = []
        self.scheduler: list[object] = []
        self.gone = set(gone)

        def send_reply(endpoint, msg):
            if endpoint in self.gone:
                raise SendTimeout(endpoint)
            self.replies.append((endpoint, msg))

        self.router = Router(tokenizer, send_reply, self.scheduler.append)

    def outputs(self, rid=None, index=None):
        """Every RequestOutput sent, taken out of the batches they travelled in."""
        outs: list[RequestOutput] = []
        for _, m in self.replies:
            if isinstance(m, RequestOutputBatch):
                outs += unpack_outputs(m)
            elif isinstance(m, RequestOutput):  # alone only to carry a scored prompt
                assert m.prompt_token_ids.size, m
                outs.append(m)
        return [m for m in outs
                if (rid is None or m.rid == rid) and (index is None or m.index == index)]


def stream_tokens(h, rid, ids, info, finish_last="stop", index=0):
    for k, t in enumerate(ids):
        new = {rid: info} if k == 0 else None
        h.router.handle([batch([(rid, index, [t], finish_last if k == len(ids) - 1 else None)],
                               new)])


def test_streamed_unicode_round_trip_and_usage(tokenizer):
    text = "Hello 🎉 wörld — 日本語 e\u0301!"
    ids = tokenizer.encode(text, add_special_tokens=False) + [EOS]
    h = Harness(tokenizer)
    stream_tokens(h, "r1", ids, detok())
    outs = h.outputs("r1")
    assert "".join(o.text for o in outs) == text
    assert all("\ufffd" not in o.text for o in outs)
    last = outs[-1]
    assert last.finish_reason == "stop" and last.completion_tokens == len(ids)
    assert last.prompt_tokens == 7 and last.cached_tokens == 3
    assert np.concatenate([o.token_ids for o in outs]).tolist() == ids
    assert h.scheduler == []  # the scheduler finished it itself: nothing to abort
    assert h.router.requests == {}


def test_stop_string_spanning_tokens_is_cut_and_aborts(tokenizer):
    text = "The answer is 42. END of story"
    ids = tokenizer.encode(text, add_special_tokens=False)
    h = Harness(tokenizer)
    stream_tokens(h, "r2", ids, detok(stop=["42. E"]), finish_last="length")
    outs = h.outputs("r2")
    assert "".join(o.text for o in outs) == "The answer is "
    assert outs[-1].finish_reason == "stop"
    # tokens up to the one completing the stop string are counted, later rows ignored
    upto = next(k for k in range(1, len(ids) + 1) if "42. E" in tokenizer.decode(ids[:k]))
    assert outs[-1].completion_tokens == upto
    assert h.scheduler == [AbortRequest(rid="r2", reason="stop")]
    assert h.router.requests == {}


def test_not_streamed_sends_one_output(tokenizer):
    text = "Ünïcödé 🧪 test"
    ids = tokenizer.encode(text, add_special_tokens=False)
    h = Harness(tokenizer)
    stream_tokens(h, "r3", ids, detok(stream=False), finish_last="length")
    [out] = h.outputs("r3")
    assert out.text == text and out.finish_reason == "length"
    assert out.token_ids.tolist() == ids and out.completion_tokens == len(ids)


def test_skip_special_tokens_false_shows_them(tokenizer):
    ids = tokenizer.encode("a<|im_start|>b", add_special_tokens=False)
    for skip, want in ((True, "ab"), (False, "a<|im_start|>b")):
        h = Harness(tokenizer)
        stream_tokens(h, "r", ids, detok(skip_special_tokens=skip), finish_last="length")
        assert "".join(o.text for o in h.outputs()) == want


def test_n_samples_each_stop_on_their_own(tokenizer):
    h = Harness(tokenizer)
    a = tokenizer.encode("yes STOP no", add_special_tokens=False)
    info = detok(n=2, stop=["STOP"])
    h.router.handle([batch([("r4", 0, a[:1], None), ("r4", 1, a[:1], None)], {"r4": info})])
    h.router.handle([batch([("r4", 0, a[1:], None), ("r4", 1, a[1:2], None)])])
    assert h.outputs(index=0)[-1].finish_reason == "stop"
    # sample 0 is stopped in the scheduler at once; sample 1 goes on
    assert h.scheduler == [AbortRequest(rid="r4", reason="stop", index=0)]
    h.router.handle([batch([("r4", 0, [5], "stop"), ("r4", 1, [EOS], "stop")])])
    assert h.scheduler == [AbortRequest(rid="r4", reason="stop", index=0)]  # nothing more
    assert "".join(o.text for o in h.outputs(index=0)) == "yes "
    # sample 1 ended (EOS) on a partial "ST": released at its end, since it never became "STOP"
    assert "".join(o.text for o in h.outputs(index=1)) == tokenizer.decode(a[:2])


def test_client_gone_aborts_request(tokenizer):
    h = Harness(tokenizer, gone={"ipc://gone"})
    h.router.handle([batch([("r5", 0, [100], None)], {"r5": detok(reply_to="ipc://gone")})])
    assert h.scheduler == [AbortRequest(rid="r5", reason="client_gone")]
    h.router.handle([batch([("r5", 0, [101], None)])])  # late rows are dropped quietly
    assert h.router.requests == {} and h.router.rows_dropped == 0


def test_error_reply_forwarded(tokenizer):
    h = Harness(tokenizer)
    h.router.handle([batch([("r6", 0, [100], None)], {"r6": detok()})])
    err = ErrorReply(rid="r6", status=503, message="worker failed", error_type="server_error")
    h.router.handle([err])
    assert h.replies[-1] == ("ipc://client", err)
    assert h.router.requests == {}
    direct = ErrorReply(rid="r7", status=429, message="queue full", reply_to="ipc://other")
    h.router.handle([direct])
    assert h.replies[-1] == ("ipc://other", direct)


def test_unknown_request_row_dropped(tokenizer):
    h = Harness(tokenizer)
    h.router.handle([batch([("ghost", 0, [100], None)])])
    assert h.replies == [] and h.router.rows_dropped == 1


@pytest.mark.parametrize("stream", [True, False])
def test_logprobs_pass_through_with_own_top_k(tokenizer, stream):
    h = Harness(tokenizer)
    ids = tokenizer.encode("hi there", add_special_tokens=False)
    n = len(ids)
    lp = -np.arange(1, n + 2, dtype=np.float32)  # two requests, the second with one token
    top_ids = np.arange((n + 1) * 3, dtype=np.int32).reshape(n + 1, 3)
    top_lp = -top_ids.astype(np.float32)
    h.router.handle([batch([("a", 0, ids, "length"), ("b", 0, [100], "length")],
                           {"a": detok(logprobs=2, stream=stream), "b": detok()},
                           lp, top_ids, top_lp)])
    [out] = h.outputs("a")
    assert out.logprobs.tolist() == lp[:n].tolist()
    assert out.top_ids.tolist() == top_ids[:n, :2].tolist()
    assert out.top_logprobs.tolist() == top_lp[:n, :2].tolist()
    assert "".join(out.token_texts) == "hi there"
    assert out.top_token_texts == [[tokenizer.decode([int(t)], skip_special_tokens=False)
                                    for t in row] for row in top_ids[:n, :2]]
    [other] = h.outputs("b")
    assert other.logprobs.size == 0 and other.token_texts == []


def test_ids_only_model_streams_ids_with_empty_text():
    from tessera.formats.tokenizer import IdsOnlyTokenizer

    h = Harness(IdsOnlyTokenizer("bench.json", 1000, [2], 64))
    stream_tokens(h, "b", [10, 11, 12], detok(), finish_last="length")
    outs = h.outputs("b")
    assert np.concatenate([o.token_ids for o in outs]).tolist() == [10, 11, 12]
    assert all(o.text == "" for o in outs) and outs[-1].completion_tokens == 3


def test_logprob_rows_of_different_widths_line_up(tokenizer):
    h = Harness(tokenizer)
    info = detok(logprobs=3, stream=False)
    wide = batch([("w", 0, [100], None)], {"w": info}, [-0.5], [[7, 8, 9, 10]],
                 [[-0.5, -1, -2, -3]])
    narrow = batch([("w", 0, [101], "length")], None, [-0.25], [[11]], [[-0.25]])
    h.router.handle([wide, narrow])
    [out] = h.outputs("w")
    assert out.top_ids.tolist() == [[7, 8, 9], [11, -1, -1]]
    assert out.top_logprobs[1, 1] == -np.inf
    assert out.top_token_texts[1][1:] == ["", ""]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_stop_string_cut_exactly(tokenizer, data):
    # Unicode text, a stop string taken from inside it (so it usually spans tokens, often
    # starting or ending inside a multi-byte character's tokens), steps of random sizes.
    pieces = ["日本語", "🎉", "👩‍💻", " hello", " wörld", "e\u0301", "\n", "ok", "。"]
    text = "".join(data.draw(st.lists(st.sampled_from(pieces), min_size=2, max_size=10)))
    a = data.draw(st.integers(0, len(text) - 1))
    b = data.draw(st.integers(a + 1, min(len(text), a + 4)))
    stop = text[a:b]
    ids = tokenizer.encode(text, add_special_tokens=False)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(ids)), max_size=5))) | {len(ids)})
    h = Harness(tokenizer)
    start = 0
    for k, end in enumerate(cuts):
        h.router.handle([batch([("q", 0, ids[start:end], "length" if end == len(ids) else None)],
                               {"q": detok(stop=[stop])} if k == 0 else None)])
        start = end
    outs = h.outputs("q")
    assert "".join(o.text for o in outs) == text[:text.find(stop)]
    assert outs[-1].finish_reason == "stop"
    assert all("\ufffd" not in o.text for o in outs)
    # counted up to the token where the stop string became whole (a character still incomplete
    # right after it can delay that by the few tokens that complete the character)
    need = next(k for k in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:k]))
    assert need <= outs[-1].completion_tokens <= min(need + 3, len(ids))


def test_rows_of_a_request_started_before_a_restart_ask_the_scheduler_to_fail_it(tokenizer):
    """A restarted detokenizer never saw the request's route: the scheduler, which knows it,
    fails the request with an error (LOST_ROUTE), once."""
    h = Harness(tokenizer)
    h.router.handle([batch([("old", 0, [5], None)])])
    h.router.handle([batch([("old", 0, [6], None)])])
    assert h.scheduler == [AbortRequest(rid="old", reason=AbortRequest.LOST_ROUTE)]
    assert h.replies == []


def test_reset_fails_every_tracked_request_and_forgets_it(tokenizer):
    h = Harness(tokenizer)
    h.router.handle([batch([("a", 0, [5], None), ("b", 0, [6], None)],
                           new={"a": detok(), "b": detok(reply_to="ipc://gone")})])
    h.replies.clear()
    h.gone.add("ipc://gone")  # b's client left meanwhile
    h.router.handle([ResetRequests(reason="the engine's scheduler restarted")])
    errors = [(ep, m) for ep, m in h.replies if isinstance(m, ErrorReply)]
    assert [(ep, m.rid, m.status) for ep, m in errors] == [("ipc://client", "a", 503)]
    assert "scheduler restarted" in errors[0][1].message
    assert h.router.requests == {}
    h.router.handle([batch([("a", 0, [7], None)])])  # a late row of a failed request
    assert h.scheduler == []  # remembered as finished: no abort, no output


def test_a_step_sends_one_message_per_client(tokenizer):
    h = Harness(tokenizer)
    rows = [(f"r{i}", 0, [100 + i], None) for i in range(5)] + [("s", 0, [200], None)]
    new = {f"r{i}": detok() for i in range(5)} | {"s": detok(reply_to="ipc://other")}
    h.router.handle([batch(rows, new)])
    assert [endpoint for endpoint, _ in h.replies] == ["ipc://client", "ipc://other"]
    first = unpack_outputs(h.replies[0][1])
    assert [o.rid for o in first] == [f"r{i}" for i in range(5)]
    assert [o.token_ids.tolist() for o in first] == [[100 + i] for i in range(5)]
    assert h.router.outputs_sent == 6
    h.router.handle([batch(rows, None)])  # the next step: one more message each
    assert len(h.replies) == 4


def test_a_gone_client_aborts_each_of_its_running_requests_once(tokenizer):
    h = Harness(tokenizer, gone={"ipc://gone"})
    rows = [("a", 0, [100], None), ("b", 0, [101], None), ("c", 0, [102], "length"),
            ("k", 0, [103], None)]
    new = {r: detok(reply_to="ipc://gone") for r in "abc"} | {"k": detok()}
    h.router.handle([batch(rows, new)])
    # c finished on its own (the scheduler knows): only the running ones are aborted
    assert sorted(m.rid for m in h.scheduler) == ["a", "b"]
    assert all(m.reason == "client_gone" for m in h.scheduler)
    assert h.router.clients_gone == 3 and set(h.router.requests) == {"k"}
    assert [o.rid for o in h.outputs()] == ["k"]  # the other client is served


def test_a_slow_client_loses_nothing(tokenizer):
    h = Harness(tokenizer, gone={"ipc://client"})
    h.router.replies.gone_after_s = 60.0  # slow for a while, not gone
    ids = tokenizer.encode("slow but steady", add_special_tokens=False)
    stream_tokens(h, "r", ids, detok(), finish_last="length")
    assert h.replies == [] and h.scheduler == [] and h.router.replies.waiting() == len(ids)
    h.gone.clear()  # the client catches up
    h.router.tick()
    outs = h.outputs("r")
    assert "".join(o.text for o in outs) == "slow but steady"
    assert outs[-1].finish_reason == "length" and h.router.clients_gone == 0


def test_rows_of_several_tokens_count_as_one_step_each(tokenizer):
    """Speculative decoding sends several tokens of a request in one step's row: the output
    counts the steps (decode_steps), so completion_tokens / decode_steps is its mean
    acceptance length."""
    text = "one two three four five six seven"
    ids = tokenizer.encode(text, add_special_tokens=False) + [EOS]
    h = Harness(tokenizer)
    rows = [ids[:1], ids[1:5], ids[5:6], ids[6:]]
    for k, part in enumerate(rows):
        h.router.handle([batch([("s", 0, part, "stop" if k == len(rows) - 1 else None)],
                               {"s": detok()} if k == 0 else None)])
    outs = h.outputs("s")
    assert "".join(o.text for o in outs) == text
    assert outs[-1].completion_tokens == len(ids) and outs[-1].decode_steps == len(rows)
