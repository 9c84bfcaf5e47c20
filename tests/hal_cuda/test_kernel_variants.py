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
        self.defaults = {p.name: p.default for p in params
                         if p.default is not inspect.Parameter.empty}
        self.unspecialized = set(jitted.kwargs.get("do_not_specialize") or ())
        self.keys: set[tuple[Any, ...]] = set()

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> None:
            bound = self.defaults | dict(zip(self.names, args, strict=False)) | kwargs
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


def _inputs(batch: int, tokens: int, width: int = 64,
            cache_dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, ...]:
    q = torch.zeros((tokens, HQ, D), dtype=torch.bfloat16)
    cache = torch.zeros((64, HK, D), dtype=cache_dtype)
    rtt = torch.zeros((batch, width), dtype=torch.int32)
    return q, cache, cache, rtt, torch.full((batch,), 40, dtype=torch.int32)


def _extend(ext: ModuleType, batch: int, tokens: int, width: int,
            cache_dtype: torch.dtype = torch.bfloat16) -> None:
    """A mixed step: request 0 extends by the rest of the tokens, the others decode."""
    ext_lens = torch.ones(batch, dtype=torch.int32)
    ext_lens[0] = tokens - batch + 1
    qo = torch.zeros(batch + 1, dtype=torch.int32)
    qo[1:] = torch.cumsum(ext_lens, 0)
    ext.attention_extend(*_inputs(batch, tokens, width, cache_dtype), ext_lens, qo,
                         D ** -0.5)


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
        before = len(recorded["extend"].keys)
        _extend(ext, batch, batch + 6, 64)
        per_extend[len(recorded["extend"].keys) - before] += 1
    # decode rows of a mixed batch: the two stage-1 kernels again with MIXED, one more merge
    assert len(recorded["stage1"].keys) == 4 and len(recorded["stage2"].keys) == 2
    # the extend kernel: one per power of two of the request count (REQS) from 32 to 256
    assert len(recorded["extend"].keys) == 4, sorted(recorded["extend"].keys)


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_eager_steps_beyond_the_graphs_reuse_the_kernels_the_graphs_compiled(
        kernels: dict[str, ModuleType], recorded: dict[str, _Recorder],
        cache_dtype: torch.dtype) -> None:
    """What start-up captures (decode graphs per batch size, mixed-step graphs per token
    bucket, every one with the static page table) compiles every attention kernel a served
    step launches, including the eager steps the graphs cannot hold (more tokens than the
    largest bucket: whole 2048-token chunks beside any number of decodes, with page tables as
    wide as the padded longest sequence). An H200 B2 run compiled the extend kernel five times
    mid-run (1.5-2.3 s a step) when the table's width followed the longest sequence and the
    extend kernel's request block started below the graphs' smallest. Over an fp8 cache too,
    whose decode tile follows the batch (FP8_SMALL_TILE)."""
    from tessera.config import EngineConfig
    from tessera.worker_proc.capture_plan import mixed_token_limit
    from tessera.worker_proc.forward_inputs import table_width
    from tessera.worker_proc.graph_decode import capture_batch_sizes
    from tessera.worker_proc.graph_mixed import token_buckets

    dec, ext = kernels["decode_attention"], kernels["extend_attention"]
    cfg = EngineConfig(model="unused", max_running_requests=256, chunked_prefill_size=2048)
    static = table_width(8192)  # the graphs' page table: the context length, padded
    for bs in capture_batch_sizes(256):
        dec.attention_decode(*_inputs(bs, bs, static, cache_dtype), D ** -0.5)
    limit = mixed_token_limit(cfg, num_slots=10**6)
    assert limit == cfg.graph_max_tokens  # the buckets stop below the largest eager steps
    for bucket in token_buckets(limit):
        _extend(ext, min(bucket, cfg.max_running_requests), bucket, static, cache_dtype)
    captured = {name: set(r.keys) for name, r in recorded.items()}

    for batch in (1, 2, 3, 5, 16, 17, 20, 31, 32, 33, 34, 63, 65, 100, 129, 130, 200, 256):
        for longest in (17, 40, 64, 100, 1000, 2048 + 300, 4111):
            _extend(ext, batch, 2048 + batch - 1, table_width(longest), cache_dtype)
    for name, r in recorded.items():
        new = r.keys - captured[name]
        assert not new, f"{name}: served steps compile {len(new)} kernels: {sorted(new)}"


def test_a_split_count_the_merge_cannot_hold_is_refused(kernels: dict[str, ModuleType]) -> None:
    dec = kernels["decode_attention"]
    with pytest.raises(ValueError, match="splits"):
        dec.attention_decode(*_inputs(1, 1), D ** -0.5, splits=dec.MAX_SPLITS + 1)


def test_quantized_gemm_launches_do_not_follow_the_token_count(
        kernels: dict[str, ModuleType], monkeypatch: pytest.MonkeyPatch) -> None:
    """The quantized GEMMs (qgemm, W8A8 split too, its weights-as-A form with and without a
    K split, the split's sum) take the token count M unspecialized: every batch of a bucket, 2 to 2048
    tokens, selects the one kernel its tuned tile compiled (a 1025-token prefill chunk once
    compiled one mid-serving on the H200, 1.9 s)."""
    from tessera.hal.quant import quantize

    ql = kernels["quant_linear"]
    rec = {name: _Recorder(getattr(ql, name))
           for name in ("qgemm_kernel", "qgemm_wt_kernel", "splitk_sum_kernel")}
    for name, r in rec.items():
        monkeypatch.setattr(ql, name, r)
    w4 = ql.prepare(quantize(torch.randn(64, 256), "int4", 128))
    w8 = ql.prepare(quantize(torch.randn(64, 256), "fp8"))
    for m in (*range(2, 70), 255, 256, 1024, 1025, 2047, 2048):
        x = torch.zeros((m, 256), dtype=torch.bfloat16)
        ql.qgemm(x, w4, None, 64, 64, 128, 4, 4)
        ql.qgemm(x, w4, None, 64, 64, 128, 4, 4, weights_as_a=True)
        ql.qgemm(x, w4, None, 64, 64, 128, 4, 4, weights_as_a=True, split_k=2)
        ql.qgemm(x, w8, None, 64, 64, 128, 4, 4, weights_as_a=True)
        ql.qgemm(torch.zeros((m, 256), dtype=torch.float8_e4m3fn), w8, None, 64, 64, 128, 4,
                 4, w8a8=True, x_scales=torch.ones((m, 1)), split_k=2)
    counts = {name: len(r.keys) for name, r in rec.items()}
    # qgemm: the int4 tile, the W8A8 split; WT: int4 whole, int4 split, fp8; the split's
    # sum: one
    assert counts == {"qgemm_kernel": 2, "qgemm_wt_kernel": 3, "splitk_sum_kernel": 1}, counts
