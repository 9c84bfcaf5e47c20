"""Mutated frames: whatever a peer sends, `decode` returns a registered message or raises
DecodeError (which every receiver counts and drops) -- never anything else, which would kill
the receiving thread. Bounded: a few hundred cases, seconds."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.bus.codec import DecodeError, decode, encode
from tessera.bus.messages import MESSAGE_TYPES, Message
from tests.bus.test_codec import EXAMPLES

FUZZ = settings(max_examples=400, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])

values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() |
    st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


def frames_of(name: str) -> list[bytes]:
    return [bytes(f) for f in encode(EXAMPLES[name])]


def check(frames: list[Any]) -> None:
    try:
        msg = decode(frames)
    except DecodeError:
        return
    assert isinstance(msg, Message) and type(msg).TYPE in MESSAGE_TYPES


@FUZZ
@given(name=st.sampled_from(sorted(EXAMPLES)), data=st.data())
def test_byte_mutations(name: str, data: st.DataObject) -> None:
    frames = frames_of(name)
    i = data.draw(st.integers(0, len(frames) - 1))
    frame = bytearray(frames[i])
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "cut", "grow", "drop", "dup"]))
        if kind == "flip" and frame:
            pos = data.draw(st.integers(0, len(frame) - 1))
            frame[pos] ^= data.draw(st.integers(1, 255))
        elif kind == "cut":
            frame = frame[:data.draw(st.integers(0, len(frame)))]
        elif kind == "grow":
            frame += data.draw(st.binary(min_size=1, max_size=16))
        elif kind == "drop" and len(frames) > 1:
            frames.pop(data.draw(st.integers(0, len(frames) - 1)))
            i = min(i, len(frames) - 1)
        elif kind == "dup":
            frames.append(frames[data.draw(st.integers(0, len(frames) - 1))])
    frames[i] = bytes(frame)
    check(frames)


@FUZZ
@given(name=st.sampled_from(sorted(EXAMPLES)), data=st.data())
def test_header_field_mutations(name: str, data: st.DataObject) -> None:
    """A well-formed header whose fields, arrays descriptions or type hold anything."""
    frames = frames_of(name)
    header = msgpack.unpackb(frames[0], raw=False)
    where = data.draw(st.sampled_from(["field", "new field", "array desc", "top"]))
    if where == "field" and header["f"]:
        key = data.draw(st.sampled_from(sorted(header["f"])))
        header["f"][key] = data.draw(values)
    elif where == "new field":
        header["f"][data.draw(st.text(max_size=8))] = data.draw(values)
    elif where == "array desc" and header["a"]:
        j = data.draw(st.integers(0, len(header["a"]) - 1))
        k = data.draw(st.integers(0, len(header["a"][j]) - 1))
        header["a"][j][k] = data.draw(values | st.lists(st.integers(-(2**63), 2**63), max_size=4))
    else:
        header[data.draw(st.sampled_from(["t", "v", "f", "a"]))] = data.draw(values)
    try:
        frames[0] = msgpack.packb(header, use_bin_type=True)
    except (ValueError, OverflowError, TypeError):
        return  # not even msgpack can say it
    check(frames)


@FUZZ
@given(frames=st.lists(st.binary(max_size=64), max_size=4))
def test_random_frames(frames: list[bytes]) -> None:
    check(frames)
