"""msgpack header + array frames: small arrays packed into one frame, large ones zero-copy.

A message is sent as a multipart ZeroMQ message:
    frame 0: msgpack map {"t": type, "v": version, "f": {plain fields},
                          "a": [[name, dtype, shape(, offset)]], "p": pack bytes}
    frame 1: the pack, when "p" > 0: the bytes of every array of at most PACK_MAX_BYTES,
             each at its `offset` (16-byte aligned)
    then: the raw bytes of each larger array (a description without an offset), in the
          order of "a", one frame each
Large arrays are sent without copying (a memoryview of a C-contiguous array goes to zmq with
copy=False) and decoded with `numpy.frombuffer` on the received frame's buffer, so the decoded
array's memory *is* the frame's. Small arrays are copied once into the pack: a frame costs
more than that copy (a zmq message and a Python object on each side, a few microseconds),
and a step's ForwardBatch carries 29 arrays, most of a few bytes or empty, on the path every
decode step waits on. Packed arrays are read with `numpy.frombuffer` on the pack's buffer.
Nothing here ever unpickles.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from functools import cache
from typing import Any

import msgpack
import numpy as np

from tessera.bus.messages import MESSAGE_TYPES, NESTED_TYPES, Message

# dtypes allowed on the wire (their `.str` names): a peer must not make us build object
# arrays.
_DTYPES: dict[str, np.dtype] = {
    np.dtype(t).str: np.dtype(t)
    for t in (np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint32, np.float16,
              np.float32, np.float64, np.bool_)
}
_ALLOWED_DTYPES = frozenset(_DTYPES)
# Arrays of at most this many bytes travel in the pack (one frame for all of them, copied);
# larger ones in frames of their own, not copied. A ForwardBatch of 256 decodes holds arrays
# of 1-2 KiB; a long prompt's token ids are hundreds of KiB.
PACK_MAX_BYTES = 8192
_PACK_ALIGN = 16  # every packed array starts at a multiple of this (aligned numpy views)
# The largest header a receiver accepts. Senders check it too (`MessageTooLarge`), so that a
# message the bus would refuse fails at once where it is made, never silently at the receiver;
# the HTTP body limit is set well below it (server/formatting.py).
MAX_HEADER_BYTES = 16 << 20


class DecodeError(ValueError):
    """A frame set that is not a valid message. Receivers count, log and drop it."""


class EncodeError(ValueError):
    """A message whose values cannot travel on the bus (text that is not valid Unicode, an
    integer beyond 64 bits, a type msgpack does not know). The sender answers the request
    with a clear error instead of sending it."""


class MessageTooLarge(EncodeError):
    """A message whose header exceeds MAX_HEADER_BYTES: every receiver would drop it."""


@dataclasses.dataclass(frozen=True)
class _Fields:
    """How a message class's fields travel."""

    arrays: tuple[str, ...]  # np.ndarray fields: frames of their own
    plain: tuple[str, ...]  # everything else: the msgpack header
    nested: dict[str, type]  # plain fields holding a nested dataclass
    nested_maps: dict[str, type]  # plain `dict[str, nested dataclass]` fields: value type
    nullable: frozenset[str]  # fields that may be None
    # array fields whose default is an empty 1-D array of this dtype (`.str`): such an array
    # when empty is not sent at all, and the receiver's dataclass default stands for it
    empty_default: dict[str, str] = dataclasses.field(default_factory=dict)
    array_set: frozenset[str] = frozenset()  # `arrays` as a set (names checked on decode)


_FIELDS: dict[type, _Fields] = {}


def _field_info(cls: type) -> _Fields:
    info = _FIELDS.get(cls)
    if info is None:
        info = _FIELDS[cls] = _describe(cls)
    return info


def _describe(cls: type) -> _Fields:
    hints = typing.get_type_hints(cls)
    arrays: list[str] = []
    plain: list[str] = []
    nested: dict[str, type] = {}
    nested_maps: dict[str, type] = {}
    nullable: set[str] = set()
    empty_default: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint)
        if type(None) in args:
            nullable.add(f.name)
        if hint is np.ndarray or np.ndarray in args:
            arrays.append(f.name)
            if f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
                if isinstance(default, np.ndarray) and default.shape == (0,):
                    empty_default[f.name] = default.dtype.str
            continue
        plain.append(f.name)
        if typing.get_origin(hint) is dict:
            if dataclasses.is_dataclass(args[1]):
                nested_maps[f.name] = args[1]  # type: ignore[assignment]
            continue
        for candidate in (hint, *args):
            if dataclasses.is_dataclass(candidate):
                nested[f.name] = candidate  # type: ignore[assignment]
    return _Fields(tuple(arrays), tuple(plain), nested, nested_maps, frozenset(nullable),
                   empty_default, frozenset(arrays))


def _nested(cls: type, owner: str, value: dict[str, Any]) -> Any:
    try:
        return NESTED_TYPES[cls.__name__].from_dict(value)  # type: ignore[attr-defined]
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"{owner}: {exc}") from None


_SCALARS = (str, int, float, bytes, type(None))


@cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _plain(value: Any) -> Any:
    # Scalars first: they are almost every value, and this runs for every field of every
    # message (the bus benchmark's per-hop cost).
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: _plain(getattr(value, name)) for name in _field_names(type(value))}
    return value


def encode(msg: Message) -> list[Any]:
    """Encode a message into frames: [header bytes, array buffer, ...] (arrays not copied)."""
    cls = type(msg)
    if cls.TYPE not in MESSAGE_TYPES:
        raise TypeError(f"{cls.__name__} is not a registered bus message")
    info = _field_info(cls)
    array_names, plain_names, empty_default = info.arrays, info.plain, info.empty_default
    fields = {name: _plain(getattr(msg, name)) for name in plain_names}
    for name in info.nested_maps:
        fields[name] = {k: _plain(v) for k, v in fields[name].items()}
    descs: list[list[Any]] = []
    buffers: list[Any] = []
    packed: list[tuple[int, np.ndarray]] = []
    pack_len = 0
    for name in array_names:
        arr = getattr(msg, name)
        if arr is None:
            fields[name] = None
            continue
        arr = np.ascontiguousarray(arr)
        dtype_str = arr.dtype.str
        if dtype_str not in _ALLOWED_DTYPES:
            raise TypeError(f"{cls.TYPE}.{name}: dtype {arr.dtype} cannot travel on the bus")
        nbytes = arr.nbytes
        if not nbytes and empty_default.get(name) == dtype_str and arr.shape == (0,):
            continue  # the receiver's default is this very array
        if nbytes <= PACK_MAX_BYTES:
            descs.append([name, dtype_str, list(arr.shape), pack_len])
            if nbytes:
                packed.append((pack_len, arr))
                pack_len += -(-nbytes // _PACK_ALIGN) * _PACK_ALIGN
        else:
            descs.append([name, dtype_str, list(arr.shape)])
            buffers.append(arr.reshape(-1).data.cast("B"))
    if pack_len:
        pack = bytearray(pack_len)
        view = memoryview(pack)
        for offset, arr in packed:
            view[offset:offset + arr.nbytes] = arr.reshape(-1).data.cast("B")
        buffers.insert(0, pack)
    try:
        header = msgpack.packb(
            {"t": cls.TYPE, "v": cls.VERSION, "f": fields, "a": descs, "p": pack_len},
            use_bin_type=True
        )
    except (TypeError, ValueError, OverflowError) as exc:  # UnicodeEncodeError is a ValueError
        raise EncodeError(f"{cls.TYPE} cannot be encoded: {_reason(exc)}") from None
    if len(header) > MAX_HEADER_BYTES:
        raise MessageTooLarge(f"{cls.TYPE} has a header of {len(header)} bytes, more than the "
                              f"bus carries ({MAX_HEADER_BYTES})")
    return [header, *buffers]


def _reason(exc: Exception) -> str:
    if isinstance(exc, UnicodeEncodeError):
        return "a string holds a lone surrogate (not valid Unicode text)"
    if isinstance(exc, OverflowError):
        return "an integer is too large (at most 64 bits)"
    return str(exc)


def _buffer(frame: Any) -> memoryview:
    if hasattr(frame, "buffer"):  # zmq.Frame received with copy=False
        return frame.buffer  # type: ignore[no-any-return]
    return memoryview(frame)


def decode(frames: list[Any]) -> Message:
    """Decode frames into a message; raise DecodeError on anything malformed."""
    if not frames:
        raise DecodeError("empty message")
    head = _buffer(frames[0])
    if len(head) > MAX_HEADER_BYTES:
        raise DecodeError(f"header of {len(head)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(head, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise DecodeError(f"header is not msgpack: {exc}") from None
    if not isinstance(header, dict) or not {"t", "v", "f", "a"} <= header.keys():
        raise DecodeError("header lacks t/v/f/a")
    cls = MESSAGE_TYPES.get(header["t"]) if isinstance(header["t"], str) else None
    if cls is None:
        raise DecodeError(f"unknown message type {header['t']!r}")
    if header["v"] != cls.VERSION:
        raise DecodeError(f"{cls.TYPE} version {header['v']!r}, expected {cls.VERSION}")
    fields, descs = header["f"], header["a"]
    if not isinstance(fields, dict) or not isinstance(descs, list):
        raise DecodeError(f"{cls.TYPE}: malformed header")
    pack_len = header.get("p", 0)
    if type(pack_len) is not int or pack_len < 0:
        raise DecodeError(f"{cls.TYPE}: malformed pack size {pack_len!r}")
    own = sum(1 for d in descs if not (isinstance(d, list) and len(d) == 4))
    if len(frames) != 1 + (1 if pack_len else 0) + own:
        raise DecodeError(f"{cls.TYPE}: {len(descs)} arrays described ({own} in frames of "
                          f"their own{', with a pack' if pack_len else ''}), "
                          f"{len(frames) - 1} frames sent")
    pack = _buffer(frames[1]) if pack_len else None
    if pack is not None and len(pack) != pack_len:
        raise DecodeError(f"{cls.TYPE}: a pack of {len(pack)} bytes, {pack_len} described")
    info = _field_info(cls)
    array_names, plain_names = info.arrays, info.plain
    nested, nested_maps = info.nested, info.nested_maps
    values: dict[str, Any] = {}
    for name, value in fields.items():
        if name not in plain_names and not (name in array_names and value is None):
            raise DecodeError(f"{cls.TYPE}: unexpected field {name!r}")
        if (name in nested or name in nested_maps) and not isinstance(value, dict) \
                and not (value is None and name in info.nullable):
            raise DecodeError(f"{cls.TYPE}.{name}: must be a map")
        if name in nested and isinstance(value, dict):
            value = _nested(nested[name], f"{cls.TYPE}.{name}", value)
        elif name in nested_maps and isinstance(value, dict):
            if not all(isinstance(v, dict) for v in value.values()):
                raise DecodeError(f"{cls.TYPE}.{name}: values must be maps")
            value = {k: _nested(nested_maps[name], f"{cls.TYPE}.{name}[{k!r}]", v)
                     for k, v in value.items()}
        values[name] = value
    own_frames = iter(frames[2:] if pack_len else frames[1:])
    array_set = info.array_set
    for desc in descs:
        try:
            name, dtype_str, shape, *where = desc
            dtype = _DTYPES.get(dtype_str) if isinstance(dtype_str, str) else None
            shape = tuple(shape) if type(shape) is list and all(
                type(s) is int for s in shape) else tuple(int(s) for s in shape)
            packed = bool(where)
            offset = where[0] if packed else 0
        except Exception:
            raise DecodeError(f"{cls.TYPE}: malformed array description {desc!r}") from None
        if type(name) is not str or name not in array_set:
            raise DecodeError(f"{cls.TYPE}: unexpected array {name!r}")
        if dtype is None or len(where) > 1 or (shape and min(shape) < 0):
            raise DecodeError(f"{cls.TYPE}.{name}: bad dtype/shape {dtype_str} {shape}")
        count = math.prod(shape)
        expected = count * dtype.itemsize
        if not packed:
            frame = next(own_frames, None)
            if frame is None:  # (counted above: only a malformed description gets here)
                raise DecodeError(f"{cls.TYPE}.{name}: no frame for it")
            buf = _buffer(frame)
            if len(buf) != expected:
                raise DecodeError(f"{cls.TYPE}.{name}: {len(buf)} bytes for {shape} {dtype}")
        elif type(offset) is not int or offset < 0 or (expected and (
                pack is None or offset + expected > len(pack))):
            raise DecodeError(f"{cls.TYPE}.{name}: {expected} bytes at offset {offset!r} "
                              f"of a pack of {pack_len}")
        try:
            if not expected:
                arr = np.zeros(shape, dtype=dtype)
            elif not packed:
                arr = np.frombuffer(buf, dtype=dtype).reshape(shape)
            else:
                assert pack is not None  # (checked above: a packed array with bytes has one)
                arr = np.frombuffer(pack, dtype=dtype, count=count,
                                    offset=offset).reshape(shape)
        except (ValueError, TypeError) as exc:  # a shape numpy refuses
            raise DecodeError(f"{cls.TYPE}.{name}: {exc}") from None
        arr.flags.writeable = False  # a view of the frame, shared by whoever holds the message
        values[name] = arr
    try:
        return cls(**values)
    except TypeError as exc:
        raise DecodeError(f"{cls.TYPE}: {exc}") from None
