"""Hypothesis strategies of hostile bus traffic: frames that decode to a registered message
whose fields hold anything (the codec checks the frame, not the meaning), and frames that do
not decode at all. Sent raw to a process's endpoint by the process fuzz tests."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import strategies as st

from tessera.bus.codec import DecodeError, decode, encode
from tests.bus.test_codec import EXAMPLES

ENDPOINTS = st.sampled_from(["", "garbage", "ipc://", "ipc:///nonexistent/x.sock",
                             "tcp://[::1", "tcp://127.0.0.1:1", "inproc://x"])
values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() |
    st.text(max_size=12) | st.binary(max_size=12) | ENDPOINTS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["reply_to", "stop", "n", "stream", "role", "content", "x"]) |
        st.text(max_size=6), inner, max_size=3),
    max_leaves=8)
# reply_to and the detokenizer's routing dicts: where a bad endpoint does the most harm
FIELD_VALUES = {
    "reply_to": ENDPOINTS | values,
    "detok": st.fixed_dictionaries({"reply_to": ENDPOINTS}) | values,
    "new_requests": st.dictionaries(st.sampled_from(["a", "b"]),
                                    st.fixed_dictionaries({"reply_to": ENDPOINTS}) | values,
                                    max_size=2) | values,
}


def _mutated(name: str, fields: dict[str, Any]) -> list[bytes] | None:
    frames = [bytes(f) for f in encode(EXAMPLES[name])]
    header = msgpack.unpackb(frames[0], raw=False)
    header["f"].update(fields)
    try:
        frames[0] = msgpack.packb(header, use_bin_type=True)
        decode(frames)
    except (DecodeError, ValueError, OverflowError, TypeError):
        return None
    return frames


@st.composite
def hostile_frames(draw: st.DrawFn, types: list[str]) -> list[bytes]:
    """One message's frames: usually decodable with odd field values, sometimes garbage."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.lists(st.binary(max_size=40), min_size=1, max_size=3))
    name = draw(st.sampled_from(types))
    plain = [k for k in msgpack.unpackb(bytes(encode(EXAMPLES[name])[0]), raw=False)["f"]]
    keys = draw(st.lists(st.sampled_from(plain), max_size=4, unique=True)) if plain else []
    frames = _mutated(name, {k: draw(FIELD_VALUES.get(k, values)) for k in keys})
    return frames if frames is not None else [bytes(f) for f in encode(EXAMPLES[name])]
