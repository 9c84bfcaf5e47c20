"""Serving compiles no kernel: the attention launches of every batch size a step can have
select among a few compiled kernels, all of which the start-up's graph captures and warm-up
steps build.

Triton compiles a kernel once per specialization: the values of its constexpr arguments, and,
for each integer argument not in `do_not_specialize`, whether it equals 1 and whether 16
divides it. A constexpr (or specialized integer) that follows the batch size compiled a new
kernel the first time a step had that many requests: on an H200 the first c=32 tier of a run
had a TTFT p90 of 520 ms, against 51 ms for the same requests once warm. The launches are
recorded here (no kernel runs) for batches of 1 to 256 requests, decode-only and mixed, with
the split count an H200 (132 SMs) would choose, and their specializations counted.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from types import ModuleType
from typing import Any

import pytest
import torch

H200_SMS = 132
HQ, HK, D = 32, 8, 128
BATCHES = range(1, 257)


class _Recorder:
    """Stands in for a jitted kernel: `kernel[grid](*args, **kwargs)` records the launch's
    specialization key instead of running it."""

    def __init__(self, jitted: Any) -> None:
        fn = jitted.fn
        params = list(inspect.signature(fn).parameters.values())
        self.names = [p.name for p in params]
        self.constexprs = {p.name for p in params if "constexpr" in str(p.annotation)}
        self.unspecialized = set(jitted.kwargs.get("do_not_specialize") or ())
        self.keys: set[tuple[Any, ...]] = set()

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> None:
            bound = dict(zip(self.names, args, strict=False)) | kwargs
            key = []
            for name in self.names:
                value = bound[name]
                if name in self.constexprs:
                    key.append((name, value))
                elif isinstance(value, int) and not isinstance(value, bool) \
                        and name not in self.unspecialized:
                    key.append((name, value == 1, value % 16 == 0))
            key += [(k, bound[k]) for k in ("num_warps", "num_stages") if k in bound]
            self.keys.add(tuple(key))
        return launch


@pytest.fixture()
def recorded(kernels: dict[str, ModuleType], monkeypatch: pytest.MonkeyPatch
             ) -> dict[str, _Recorder]:
    dec, ext = kernels["decode_attention"], kernels["extend_attention"]
    rec = {"stage1": _Recorder(dec._decode_stage1), "stage2": _Recorder(dec._decode_stage2),
           "extend": _Recorder(ext._extend_kernel)}
    monkeypatch.setattr(dec, "_decode_stage1", rec["stage1"])
    monkeypatch.setattr(dec, "_decode_stage2", rec["stage2"])
    monkeypatch.setattr(ext, "_extend_kernel", rec["extend"])
    monkeypatch.setattr(dec, "num_splits",
                        lambda batch, kv_heads, device: dec.splits_for(batch, kv_heads,
                                                                       H200_SMS))
    return rec


def _inputs(batch: int, tokens: int) -> tuple[torch.Tensor, ...]:
    q = torch.zeros((tokens, HQ, D), dtype=torch.bfloat16)
    cache = torch.zeros((64, HK, D), dtype=torch.bfloat16)
    rtt = torch.zeros((batch, 64), dtype=torch.int32)
    return q, cache, cache, rtt, torch.full((batch,), 40, dtype=torch.int32)


def test_attention_launches_over_every_batch_size_select_few_kernels(
        kernels: dict[str, ModuleType], recorded: dict[str, _Recorder]) -> None:
    dec, ext = kernels["decode_attention"], kernels["extend_attention"]
    for batch in BATCHES:
        dec.attention_decode(*_inputs(batch, batch), D ** -0.5)
    decode_only = {name: len(r.keys) for name, r in recorded.items()}
    # one split (large batches) or several; one merge kernel
    assert decode_only == {"stage1": 2, "stage2": 1, "extend": 0}, decode_only

    per_extend: dict[int, int] = defaultdict(int)
    for batch in BATCHES:
        # a mixed step: one request extends by a chunk of 7 tokens, the others decode
        ext_lens = torch.ones(batch, dtype=torch.int32)
        ext_lens[0] = 7
        tokens = batch + 6
        qo = torch.zeros(batch + 1, dtype=torch.int32)
        qo[1:] = torch.cumsum(ext_lens, 0)
        before = len(recorded["extend"].keys)
        ext.attention_extend(*_inputs(batch, tokens), ext_lens, qo, D ** -0.5)
        per_extend[len(recorded["extend"].keys) - before] += 1
    # decode rows of a mixed batch: the two stage-1 kernels again with MIXED, one more merge
    assert len(recorded["stage1"].keys) == 4 and len(recorded["stage2"].keys) == 2
    # the extend kernel: one per power of two of the request count (REQS) from 16 to 256
    assert len(recorded["extend"].keys) == 5, sorted(recorded["extend"].keys)


def test_a_split_count_the_merge_cannot_hold_is_refused(kernels: dict[str, ModuleType]) -> None:
    dec = kernels["decode_attention"]
    with pytest.raises(ValueError, match="splits"):
        dec.attention_decode(*_inputs(1, 1), D ** -0.5, splits=dec.MAX_SPLITS + 1)
