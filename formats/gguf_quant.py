"""llama.cpp's block formats -> the runtime schemes (hal/quant), without going through floats.

Each GGUF row of K weights is K / block_size blocks of bytes. The conversions below follow
ggml-quants.c's dequantize_row_* and are exact: the value every weight stands for is
unchanged (checked against gguf's own dequantize in tests/formats/test_gguf_quant.py).

    Q8_0  34 B / 32:  fp16 d, int8 q[32]                  w = d * q          -> int8, group 32
    Q4_0  18 B / 32:  fp16 d, 16 B of nibbles             w = d * (q - 8)    -> int4, group 32
    Q4_1  20 B / 32:  fp16 d, fp16 m, 16 B of nibbles     w = d * q + m      -> int4, group 32
    Q4_K 144 B / 256: fp16 d, fp16 dmin, 12 B of 6-bit scales and mins for 8 sub-blocks of 32,
                      128 B of nibbles                    w = d*sc*q - dmin*mn -> int4, group 32
    Q6_K 210 B / 256: 128 B low nibbles, 64 B high 2-bit pairs, int8 scales[16], fp16 d
                                                          w = d * sc * (q - 32) -> int8, group 16
In Q4_0/Q4_1 a block's byte j holds element j (low nibble) and j + 16 (high nibble); in Q4_K
each 32-byte chunk holds two sub-blocks, the low nibbles then the high ones.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from tessera.hal.quant.weight import QuantizedWeight, pack_int4

# GGML type name -> (elements per block, bytes per block)
BLOCKS: dict[str, tuple[int, int]] = {
    "Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q4_K": (256, 144), "Q6_K": (256, 210),
}


def _blocks(data: np.ndarray, kind: str, in_features: int) -> np.ndarray:
    """uint8 [rows, bytes] -> uint8 [rows, blocks, bytes_per_block]."""
    per_block, nbytes = BLOCKS[kind]
    rows = data.shape[0]
    if in_features % per_block or data.shape[-1] != in_features // per_block * nbytes:
        raise ValueError(f"{kind} row of {in_features} weights must be "
                         f"{in_features // per_block * nbytes} bytes, got {data.shape[-1]}")
    return np.ascontiguousarray(data, dtype=np.uint8).reshape(rows, in_features // per_block,
                                                              nbytes)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte `start` of every block, as float32 [rows, blocks]."""
    return blocks[..., start:start + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _int4(q: np.ndarray, scales: np.ndarray, offsets: np.ndarray, group: int,
          in_features: int) -> QuantizedWeight:
    rows = q.shape[0]
    return QuantizedWeight(
        "int4", pack_int4(torch.from_numpy(q.reshape(rows, in_features))),
        torch.from_numpy(np.ascontiguousarray(scales.reshape(rows, -1), dtype=np.float32)),
        torch.from_numpy(np.ascontiguousarray(offsets.reshape(rows, -1), dtype=np.float32)),
        group, in_features)


def _int8(q: np.ndarray, scales: np.ndarray, group: int, in_features: int) -> QuantizedWeight:
    rows = q.shape[0]
    return QuantizedWeight(
        "int8", torch.from_numpy(np.ascontiguousarray(q.reshape(rows, in_features))
                                 .view(np.int8)),
        torch.from_numpy(np.ascontiguousarray(scales.reshape(rows, -1), dtype=np.float32)),
        None, group, in_features)


def _split_nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] values: byte j's low nibble is element j, its high one
    element j + 16."""
    return np.concatenate((qs & 0xF, qs >> 4), axis=-1)


def q8_0(data: np.ndarray, k: int) -> QuantizedWeight:
    b = _blocks(data, "Q8_0", k)
    return _int8(b[..., 2:34], _f16(b, 0), 32, k)


def q4_0(data: np.ndarray, k: int) -> QuantizedWeight:
    b = _blocks(data, "Q4_0", k)
    d = _f16(b, 0)
    return _int4(_split_nibbles(b[..., 2:18]), d, -8.0 * d, 32, k)


def q4_1(data: np.ndarray, k: int) -> QuantizedWeight:
    b = _blocks(data, "Q4_1", k)
    return _int4(_split_nibbles(b[..., 4:20]), _f16(b, 0), _f16(b, 2), 32, k)


def _k4_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 for all 8 sub-blocks: 12 bytes -> (scales, mins) [..., 8]."""
    s = s.astype(np.uint16)
    sc = np.concatenate((s[..., 0:4] & 63,
                         (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)), axis=-1)
    mn = np.concatenate((s[..., 4:8] & 63,
                         (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)), axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def q4_k(data: np.ndarray, k: int) -> QuantizedWeight:
    b = _blocks(data, "Q4_K", k)
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k4_scales_mins(b[..., 4:16])
    qs = b[..., 16:144].reshape(*b.shape[:2], 4, 32)  # 4 chunks of 32 bytes
    q = np.stack((qs & 0xF, qs >> 4), axis=-2)  # [rows, blocks, 4, 2, 32]: sub-block 2c, 2c+1
    # d * sc and dmin * mn are exact in float32 (an fp16 times a 6-bit integer)
    return _int4(q, d[..., None] * sc, -(dmin[..., None] * mn), 32, k)


def q6_k(data: np.ndarray, k: int) -> QuantizedWeight:
    b = _blocks(data, "Q6_K", k)
    ql = b[..., 0:128].reshape(*b.shape[:2], 2, 64)  # two halves of 128 weights
    qh = b[..., 128:192].reshape(*b.shape[:2], 2, 32)
    sc = b[..., 192:208].copy().view(np.int8).astype(np.float32)
    d = _f16(b, 208)
    lo = np.concatenate((ql[..., :32] & 0xF, ql[..., 32:] & 0xF, ql[..., :32] >> 4,
                         ql[..., 32:] >> 4), axis=-1)  # [rows, blocks, 2, 128]
    hi = np.concatenate(((qh >> 0) & 3, (qh >> 2) & 3, (qh >> 4) & 3, (qh >> 6) & 3), axis=-1)
    q = (lo | (hi << 4)).astype(np.int16) - 32  # in [-32, 31]
    return _int8(q.astype(np.int8), d[..., None] * sc, 16, k)


CONVERTERS: dict[str, Callable[[np.ndarray, int], QuantizedWeight]] = {
    "Q8_0": q8_0, "Q4_0": q4_0, "Q4_1": q4_1, "Q4_K": q4_k, "Q6_K": q6_k,
}
SCHEME_OF = {"Q8_0": "int8", "Q4_0": "int4", "Q4_1": "int4", "Q4_K": "int4", "Q6_K": "int8"}


def from_gguf_blocks(kind: str, data: np.ndarray, in_features: int) -> QuantizedWeight | None:
    """The runtime form of a GGUF tensor of type `kind`, or None for a type without one (the
    caller dequantizes those)."""
    convert = CONVERTERS.get(kind)
    return None if convert is None else convert(data, in_features)
