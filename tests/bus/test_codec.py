"""Codec: round trip of every message type, zero-copy arrays, malformed input rejected."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from tessera.bus import messages as m
from tessera.bus.codec import (
    MAX_HEADER_BYTES,
    PACK_MAX_BYTES,
    DecodeError,
    EncodeError,
    MessageTooLarge,
    decode,
    encode,
)
from tessera.bus.messages import (
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    AbortRequest,
    ErrorReply,
    Message,
    SamplingParams,
)


def i32(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int32)


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


# One realistic instance per message type; a new type without an example fails
# test_every_message_type_has_an_example, so the round trip always covers every type.
EXAMPLES: dict[str, Message] = {
    "GenerateRequest": m.GenerateRequest(
        rid="r1", reply_to="ipc:///tmp/x.sock",
        sampling=SamplingParams(temperature=0.7, stop=("\n\n", "END"), stop_token_ids=(2,),
                                seed=42, logprobs=3, max_tokens=None),
        messages=[{"role": "user", "content": "héllo ✓"}], input_ids=i32(1, 2, 3),
        stream=False, priority=-2, arrival_time=1.5),
    "AbortRequest": m.AbortRequest(rid="r1", reason="client gone"),
    "TokenizedRequest": m.TokenizedRequest(
        rid="r2", input_ids=i32(5, 6, 7, 8),
        sampling=SamplingParams(n=2, logit_bias={7: -100.0, 9: 2.5}, grammar=m.GrammarSpec(
            "json_schema", '{"type": "object"}', "response_format")),
        detok=m.DetokInfo(reply_to="ipc:///tmp/y.sock", stream=False, n=2, stop=("x",),
                          stop_token_ids=(2, 7), skip_special_tokens=False, logprobs=3,
                          prompt_tokens=4),
        priority=1, arrival_time=2.0),
    "WorkerReady": m.WorkerReady(rank=0, world_size=2, num_slots=4096, page_size=16,
                                 max_context_len=8192, vocab_size=49152,
                                 eos_token_ids=[0, 2], device="cpu"),
    "ForwardBatch": m.ForwardBatch(
        step=9, rows=i32(0, 3), seq_lens=i32(10, 1), extend_lens=i32(1, 1),
        input_ids=i32(-1, 17), sample=np.array([1, 1], dtype=np.uint8), output_lens=i32(4, 0),
        temperature=f32(0.0, 1.0), top_p=f32(1.0, 0.9), top_k=i32(-1, 40),
        min_p=f32(0.0, 0.05), repetition_penalty=f32(1.0, 1.1),
        frequency_penalty=f32(0.0, 0.5), presence_penalty=f32(0.0, 0.2),
        seeds=np.array([-1, 123], dtype=np.int64), logprobs=i32(-1, 2),
        block_offsets=i32(0, 1, 1), block_ids=i32(2), hist_offsets=i32(0, 0, 3),
        hist_ids=i32(4, 5, 6), hist_prompt_lens=i32(0, 2),
        bias_offsets=i32(0, 2, 2), bias_ids=i32(7, 9), bias_values=f32(-100.0, 2.5),
        grammar_ids=np.array([-1, 6], dtype=np.int64),
        grammar_free=np.array([2, 3], dtype=np.int64), prompt_targets=i32(-1, 18),
        prompt_top_n=i32(-1, 2), is_decode=True),
    "SampledTokens": m.SampledTokens(
        step=9, token_ids=i32(11, 12), logprobs=f32(-0.1, -2.0),
        top_ids=np.array([[11, 3], [12, -1]], dtype=np.int32),
        top_logprobs=np.array([[-0.1, -3.0], [-2.0, -np.inf]], dtype=np.float32),
        forward_ms=3.25, error=None, grammar_end=np.array([0, 1], dtype=np.uint8),
        prompt_logprobs=f32(-0.7), prompt_top_ids=np.array([[18, 4]], dtype=np.int32),
        prompt_top_logprobs=np.array([[-0.7, -1.5]], dtype=np.float32)),
    "GrammarInit": m.GrammarInit(first_id=6, count=2,
                                 grammar=m.GrammarSpec("regex", "[a-z]+", "regex")),
    "GrammarReady": m.GrammarReady(first_id=6, error="the regex does not compile"),
    "FlushCache": m.FlushCache(reason="admin"),
    "TokenBatch": m.TokenBatch(
        rids=["a", "b"], indices=[0, 1], counts=i32(1, 2), token_ids=i32(7, 8, 9),
        finish=[None, "stop"], prompt_tokens=[3, 4], cached_tokens=[0, 2],
        new_requests={"a": m.DetokInfo(reply_to="ipc:///tmp/z.sock", stop=("\n",))},
        matched_stop=[None, 2],
        prompt_rids=["b"], prompt_counts=i32(2), prompt_token_ids=i32(5, 18),
        prompt_logprobs=f32(np.nan, -0.7), prompt_top_ids=np.array([[-1], [18]], np.int32),
        prompt_top_logprobs=np.array([[-np.inf], [-0.7]], dtype=np.float32)),
    "RequestOutput": m.RequestOutput(
        rid="a", index=0, text="Hello, wörld", token_ids=i32(7, 8), finish_reason="length",
        prompt_tokens=3, completion_tokens=2, cached_tokens=1, logprobs=f32(-0.5, -0.25),
        token_texts=["Hello", ", wörld"], prompt_token_ids=i32(5, 18),
        prompt_logprobs=f32(np.nan, -0.7), prompt_token_texts=["a", "b"]),
    "RequestOutputBatch": m.RequestOutputBatch(
        rids=["a", "b"], indices=[0, 2], texts=["Hi", " wörld"], token_offsets=i32(0, 1, 3),
        token_ids=i32(7, 8, 9), finish_reasons=[None, "stop"], prompt_tokens=[3, 4],
        completion_tokens=[1, 2], cached_tokens=[0, 1], logprob_offsets=i32(0, 1, 3),
        logprobs=f32(-0.5, -0.25, -1.0), top_widths=[1, 0],
        top_ids=np.array([[7], [-1], [-1]], dtype=np.int32),
        top_logprobs=np.array([[-0.5], [-np.inf], [-np.inf]], dtype=np.float32),
        token_texts=[["Hi"], [" w", "örld"]], top_token_texts=[[["Hi"]], [[], []]]),
    "ErrorReply": m.ErrorReply(rid="a", status=413, message="prompt too long",
                               param="messages", reply_to="ipc:///tmp/z.sock"),
    "ResetRequests": m.ResetRequests(reason="the scheduler restarted"),
    "Ready": m.Ready(process="worker0", pid=123, info={"model": "smol", "slots": 4096}),
    "Heartbeat": m.Heartbeat(process="scheduler", pid=5, time=1e9,
                             stats={"running": 3.0, "queued": 0.0}),
    "StatusRequest": m.StatusRequest(reply_to="ipc:///tmp/s.sock", nonce=4),
    "StatusReply": m.StatusReply(nonce=4, ready=True, processes={
        "server": {"alive": True, "pid": 9, "age_s": 0.2, "stats": {"requests": 1.0}}}),
    "Shutdown": m.Shutdown(reason="test"),
    "NodeJoin": m.NodeJoin(node_rank=1, nnodes=2, ranks=[1], config_digest="ab12"),
    "NodeWelcome": m.NodeWelcome(node_rank=1, accepted=False, reason="another model"),
    "NodeHeartbeat": m.NodeHeartbeat(node_rank=1, time=12.5, leaving=True),
    "PageRows": m.PageRows(step=4, rows=i32(0, 3), starts=i32(0, 16), offsets=i32(0, 2, 3),
                           slots=i32(5, 6, 7)),
}


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif dataclasses.is_dataclass(a):
        assert type(a) is type(b)
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, tuple | list):
        assert list(a) == list(b)
    else:
        assert a == b


def test_every_message_type_has_an_example() -> None:
    assert set(EXAMPLES) == set(MESSAGE_TYPES)


@pytest.mark.parametrize("name", sorted(MESSAGE_TYPES))
def test_round_trip_in_memory(name: str) -> None:
    msg = EXAMPLES[name]
    frames = [bytes(f) for f in encode(msg)]  # as bytes, the way a copying socket delivers
    assert_same(msg, decode(frames))


@pytest.mark.parametrize("name", sorted(MESSAGE_TYPES))
def test_round_trip_over_a_socket(name: str, zmq_pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    push, pull = zmq_pair
    push.send_multipart(encode(EXAMPLES[name]), copy=False)
    assert_same(EXAMPLES[name], decode(pull.recv_multipart(copy=False)))


def test_defaults_and_none_arrays_round_trip() -> None:
    msg = m.GenerateRequest(rid="r", reply_to="ipc:///tmp/r", prompt="hi")
    out = decode(encode(msg))
    assert out.input_ids is None and out.sampling == SamplingParams() and out.prompt == "hi"
    empty = decode(encode(m.SampledTokens(step=1, token_ids=i32())))
    assert empty.token_ids.shape == (0,) and empty.logprobs.dtype == np.float32


def test_decoded_array_is_the_received_frame(zmq_pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    ids = np.arange(100_000, dtype=np.int32)
    frames = encode(m.TokenizedRequest(rid="z", input_ids=ids, sampling=SamplingParams(),
                                       detok=m.DetokInfo(reply_to="ipc:///tmp/z")))
    # Sending side: the frame is a view of the array, not a copy.
    assert np.shares_memory(np.frombuffer(frames[1], dtype=np.int32), ids)
    push, pull = zmq_pair
    push.send_multipart(frames, copy=False)
    received = pull.recv_multipart(copy=False)
    msg = decode(received)
    frame_memory = np.frombuffer(received[1].buffer, dtype=np.uint8)
    assert np.shares_memory(msg.input_ids, frame_memory)
    assert msg.input_ids.ctypes.data == frame_memory.ctypes.data
    assert not msg.input_ids.flags.writeable  # a view of the frame: copy before writing
    np.testing.assert_array_equal(msg.input_ids, ids)


def test_small_arrays_share_one_frame_and_empty_defaults_are_not_sent(
        zmq_pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    """A decode step's ForwardBatch: its small arrays travel in one pack frame (16-byte
    aligned), the empty ones its defaults stand for not at all, and all come back equal."""
    msg = m.ForwardBatch(step=3, rows=i32(5), seq_lens=i32(600), extend_lens=i32(1),
                         input_ids=i32(-1), sample=np.ones(1, np.uint8), output_lens=i32(7),
                         temperature=f32(0.0), top_p=f32(1.0), top_k=i32(-1), min_p=f32(0.0),
                         repetition_penalty=f32(1.0), frequency_penalty=f32(0.0),
                         presence_penalty=f32(0.0), seeds=np.array([9], np.int64),
                         logprobs=i32(-1), is_decode=True)
    frames = encode(msg)
    assert len(frames) == 2  # the header and one pack
    head = msgpack.unpackb(frames[0], raw=False)
    sent = {d[0]: d for d in head["a"]}
    assert set(sent) == {"rows", "seq_lens", "extend_lens", "input_ids", "sample",
                         "output_lens", "temperature", "top_p", "top_k", "min_p",
                         "repetition_penalty", "frequency_penalty", "presence_penalty",
                         "seeds", "logprobs"}
    assert all(len(d) == 4 and d[3] % 16 == 0 for d in sent.values())
    assert head["p"] == len(frames[1]) == 16 * len(sent)
    push, pull = zmq_pair
    push.send_multipart(frames, copy=False)
    out = decode(pull.recv_multipart(copy=False))
    assert_same(msg, out)
    assert out.block_ids.dtype == np.int32 and out.block_ids.shape == (0,)
    assert not out.rows.flags.writeable


def test_large_and_small_arrays_mix() -> None:
    """Arrays above the pack limit keep frames of their own, after the pack, in order."""
    big = np.arange(PACK_MAX_BYTES // 4 + 1, dtype=np.int32)
    msg = m.SampledTokens(step=1, token_ids=big, logprobs=f32(-0.5), counts=i32(2, 3))
    frames = encode(msg)
    assert len(frames) == 3 and len(frames[2]) == big.nbytes
    assert np.shares_memory(np.frombuffer(frames[2], dtype=np.int32), big)
    assert_same(msg, decode([bytes(f) for f in frames]))


def test_non_contiguous_array_is_sent_correctly() -> None:
    base = np.arange(20, dtype=np.int32).reshape(4, 5)
    msg = m.SampledTokens(step=0, token_ids=base[:, 1])
    np.testing.assert_array_equal(decode(encode(msg)).token_ids, base[:, 1])


def header(t: Any = "Shutdown", v: Any = PROTOCOL_VERSION, f: Any = None,
           a: Any = None, p: Any = None) -> bytes:
    head = {"t": t, "v": v, "f": {} if f is None else f, "a": [] if a is None else a}
    if p is not None:
        head["p"] = p
    return msgpack.packb(head)


MALFORMED = {
    "empty": [],
    "not msgpack": [b"\xc1\xc1"],
    "not a map": [msgpack.packb([1, 2, 3])],
    "missing keys": [msgpack.packb({"t": "Shutdown"})],
    "unknown type": [header(t="LaunchMissiles")],
    "type not a string": [header(t=7)],
    "wrong version": [header(v=99)],
    "unknown field": [header(f={"reason": "x", "evil": 1})],
    "missing required field": [header(t="AbortRequest")],
    "frame count mismatch": [header(t="SampledTokens", f={"step": 1}), b"\0" * 4],
    "array size mismatch": [header(t="SampledTokens", f={"step": 1},
                                   a=[["token_ids", "<i4", [3]]]), b"\0" * 8],
    "object dtype": [header(t="SampledTokens", f={"step": 1},
                            a=[["token_ids", "|O", [1]]]), b"\0" * 8],
    "negative shape": [header(t="SampledTokens", f={"step": 1},
                              a=[["token_ids", "<i4", [-1]]]), b""],
    "pack size not an int": [header(t="SampledTokens", f={"step": 1}, p="16",
                                    a=[["token_ids", "<i4", [1], 0]]), b"\0" * 16],
    "negative pack size": [header(t="SampledTokens", f={"step": 1}, p=-16,
                                  a=[["token_ids", "<i4", [1], 0]]), b"\0" * 16],
    "pack shorter than said": [header(t="SampledTokens", f={"step": 1}, p=32,
                                      a=[["token_ids", "<i4", [1], 0]]), b"\0" * 16],
    "packed array beyond the pack": [header(t="SampledTokens", f={"step": 1}, p=16,
                                            a=[["token_ids", "<i4", [5], 0]]), b"\0" * 16],
    "packed array at a negative offset": [header(t="SampledTokens", f={"step": 1}, p=16,
                                                 a=[["token_ids", "<i4", [1], -4]]),
                                          b"\0" * 16],
    "offset not an int": [header(t="SampledTokens", f={"step": 1}, p=16,
                                 a=[["token_ids", "<i4", [1], 1.5]]), b"\0" * 16],
    "packed array without a pack": [header(t="SampledTokens", f={"step": 1},
                                           a=[["token_ids", "<i4", [1], 0]])],
    "description of five items": [header(t="SampledTokens", f={"step": 1}, p=16,
                                         a=[["token_ids", "<i4", [1], 0, 0]]), b"\0" * 16],
    "pack frame missing": [header(t="SampledTokens", f={"step": 1}, p=16,
                                  a=[["token_ids", "<i4", [1], 0]])],
    "array for a plain field": [header(t="SampledTokens", f={"step": 1},
                                       a=[["step", "<i4", [1]], ["token_ids", "<i4", [0]]]),
                                b"\0" * 4, b""],
    "bad sampling params": [header(t="TokenizedRequest",
                                   f={"rid": "r", "sampling": {"temprature": 1},
                                      "detok": {"reply_to": "ipc://c"}},
                                   a=[["input_ids", "<i4", [0]]]), b""],
    "detok without reply_to": [header(t="TokenizedRequest",
                                      f={"rid": "r", "sampling": {}, "detok": {"n": 1}},
                                      a=[["input_ids", "<i4", [0]]]), b""],
    "detok not a map": [header(t="TokenizedRequest",
                               f={"rid": "r", "sampling": {}, "detok": "ipc://c"},
                               a=[["input_ids", "<i4", [0]]]), b""],
    "detok of None": [header(t="TokenizedRequest", f={"rid": "r", "sampling": {}, "detok": None},
                             a=[["input_ids", "<i4", [0]]]), b""],
    "unknown detok field": [header(t="TokenizedRequest",
                                   f={"rid": "r", "sampling": {},
                                      "detok": {"reply_to": "ipc://c", "route": 1}},
                                   a=[["input_ids", "<i4", [0]]]), b""],
    "new request not a map": [header(t="TokenBatch",
                                     f={"rids": [], "indices": [], "finish": [],
                                        "prompt_tokens": [], "cached_tokens": [],
                                        "new_requests": {"a": "ipc://c"}},
                                     a=[["counts", "<i4", [0]], ["token_ids", "<i4", [0]]]),
                              b"", b""],
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_frames_raise_decode_error(case: str) -> None:
    with pytest.raises(DecodeError):
        decode(MALFORMED[case])


def test_encode_refuses_unregistered_and_object_arrays() -> None:
    @dataclasses.dataclass(frozen=True)
    class Stray(Message):
        x: int = 0

    with pytest.raises(TypeError, match="not a registered"):
        encode(Stray())
    with pytest.raises(TypeError, match="cannot travel"):
        encode(m.SampledTokens(step=0, token_ids=np.array(["a"], dtype=object)))


@pytest.mark.parametrize("msg, words", [
    (AbortRequest(rid="\ud800"), "lone surrogate"),
    (ErrorReply(rid="r", status=2**70, message="x"), "too large"),
    (ErrorReply(rid="r", status=400, message="x" * MAX_HEADER_BYTES), "header of"),
])
def test_values_the_bus_cannot_carry_raise_encode_error_at_the_sender(msg: Message,
                                                                      words: str) -> None:
    """The sender learns at once (and answers its caller); nothing reaches a receiver that
    would drop it."""
    with pytest.raises(EncodeError, match=words) as info:
        encode(msg)
    assert isinstance(info.value, MessageTooLarge) == (words == "header of")
