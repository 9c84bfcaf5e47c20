"""The cuda plugin's quantized-linear kernels on the CPU (Triton's interpreter), fp32, tiny
shapes, against the definition y = x @ dequantize(w)^T (hal/quant)."""

from __future__ import annotations

import math
from dataclasses import replace
from types import ModuleType

import pytest
import torch

from tessera.hal.quant import (
    QuantizedWeight,
    quant_linear_reference,
    quantize,
    quantize_activations_fp8,
)

TOL = {"atol": 1e-4, "rtol": 1e-4}
# (scheme, group): GGUF's 16 and 32, AWQ/GPTQ's 128 here 64 (tiny K), and one scale per row
CASES = [("fp8", None), ("int8", 16), ("int8", 64), ("int4", 32), ("int4", 64),
         ("int4", 256)]


def _weight(scheme: str, group: int | None, n: int, k: int, seed: int) -> QuantizedWeight:
    dense = torch.randn((n, k), generator=torch.Generator().manual_seed(seed)) / math.sqrt(k)
    return quantize(dense, scheme, group)


def _triton_gemvs(cands: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """The one-token configs the interpreter runs: all but the CUDA C GEMV's (native_gemv,
    checked on the GPU)."""
    from tessera.hal.cuda import quant_kernels

    return [c for c in cands if not c[3] & quant_kernels.GEMV_NATIVE]


def _x(m: int, k: int, seed: int) -> torch.Tensor:
    return torch.randn((m, k), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("scheme,group", CASES, ids=[f"{s}-g{g}" for s, g in CASES])
def test_qgemv(kernels: dict[str, ModuleType], scheme: str, group: int | None,
               with_bias: bool) -> None:
    ql = kernels["quant_linear"]
    # 37 rows: masking on the last row block; 256 inputs; group 256 = one group per row
    w = ql.prepare(_weight(scheme, group, 37, 256, seed=1))
    x = _x(1, 256, seed=2)
    bias = torch.randn(37) if with_bias else None
    for block_n, block_k, warps in [(4, 64, 4), (8, 256, 4), (2, 512, 4)]:
        if w.num_groups > 1 and block_k % w.group_size:
            continue
        out = ql.qgemv(x, w, bias, block_n, block_k, warps)
        torch.testing.assert_close(out, quant_linear_reference(x, w, bias), **TOL)


# every GEMV formulation: (scheme, group or None for one scale per row, input width); the
# widths are not multiples of the small BLOCK_K below, so the last tile is partly masked
VARIANT_CASES = [("fp8", None, 200), ("int8", None, 200), ("int8", 32, 416),
                 ("int8", 128, 640), ("int4", None, 200), ("int4", 32, 416),
                 ("int4", 128, 640)]


def _awq_offsets(w: QuantizedWeight, seed: int) -> QuantizedWeight:
    """int4 offsets as AWQ stores them (-scale * zero point, zero points anywhere in 0..15),
    not the ones min/max quantization chose: a kernel that applied them to the wrong group
    or row would now disagree with the definition."""
    if w.offsets is None:
        return w
    zeros = torch.randint(0, 16, w.scales.shape, generator=torch.Generator().manual_seed(seed))
    return replace(w, offsets=-w.scales * zeros.float())


@pytest.mark.parametrize("scheme,group,k", VARIANT_CASES,
                         ids=[f"{s}-g{g or 'row'}-k{k}" for s, g, k in VARIANT_CASES])
def test_qgemv_every_variant(kernels: dict[str, ModuleType], scheme: str, group: int | None,
                             k: int) -> None:
    """Each formulation (every combination of quant_kernels' GEMV_* flags) against the
    definition, with tiles small enough to loop over several groups and tiles, and with every
    tuned candidate's own tile (wider than these inputs: masked)."""
    from tessera.hal.cuda import quant_tune

    ql = kernels["quant_linear"]
    w = ql.prepare(_awq_offsets(_weight(scheme, group or k, 37, k, seed=20), seed=21))
    assert (w.num_groups == 1) == (group is None)
    x = _x(1, k, seed=22)
    bias = torch.randn(37, generator=torch.Generator().manual_seed(23))
    want = quant_linear_reference(x, w, bias)
    acc_fits = w.num_groups == 1 and scheme != "int4"  # GEMV_ACC: one scale a row, 8 bits
    small = [(bn, bk, 4, v) for v in quant_tune.GEMV_VARIANTS
             if acc_fits or not v & quant_tune.GEMV_ACC
             for bn, bk in ((4, 256), (2, 128))
             if w.num_groups == 1 or bk % w.group_size == 0]
    assert small, "no small tile holds whole groups"
    for cfg in small + _triton_gemvs(quant_tune.gemv_candidates(w)):
        out = quant_tune.one_token(x, w, bias, cfg)
        torch.testing.assert_close(out, want, **TOL, msg=lambda m, c=cfg: f"{c}: {m}")


@pytest.mark.parametrize("scheme,group", [("int4", None), ("int4", 64), ("int8", 64)])
def test_qgemv_accumulator_refuses_groups_and_nibbles(kernels: dict[str, ModuleType],
                                                      scheme: str, group: int | None) -> None:
    """GEMV_ACC sums the products of one scale a row: a grouped or int4 weight is refused by
    name, not computed wrong, and the tuner never lists it for one."""
    from tessera.hal.cuda import quant_tune

    ql = kernels["quant_linear"]
    w = ql.prepare(_weight(scheme, group or 256, 16, 256, seed=30))
    with pytest.raises(ValueError, match="GEMV_ACC"):
        ql.qgemv(_x(1, 256, seed=31), w, None, 4, 256, 4, quant_tune.GEMV_ACC)
    assert not any(c[3] & quant_tune.GEMV_ACC for c in quant_tune.gemv_candidates(w))


def test_gemv_candidates_cover_every_variant() -> None:
    """The tuner measures each formulation for int8 (never swept on a GPU: the reshaped tile,
    the per-column scales, each with the exponent-bit conversion, and x-wide loads), and
    tiles that move 8-16 KiB of weight per iteration; fp8 and int4 keep what the H200 sweep
    of a grid of tiles found fastest on the 8B shape (quant_gemv_wide_h200.json), first."""
    from tessera.hal.cuda import quant_kernels as qk
    from tessera.hal.cuda import quant_tune

    bytes_per_weight = {"int8": 1.0, "int4": 0.5}
    wanted = {0, qk.GEMV_COLUMN, qk.GEMV_EXP_CVT, qk.GEMV_COLUMN | qk.GEMV_EXP_CVT,
              qk.GEMV_EXP_CVT | qk.GEMV_X_VEC}
    cands = quant_tune.GEMV_CANDIDATES
    for scheme, cs in cands.items():
        assert all(len(c) == 4 and (c[3] in quant_tune.GEMV_VARIANTS or
                                    c[3] == qk.GEMV_DOT or c[3] & qk.GEMV_NATIVE)
                   for c in cs), scheme
    assert cands["fp8"][0] == (4, 2048, 4, 0)  # the H200 grid's fastest over the 8B shape
    assert any(c[3] == qk.GEMV_ACC | qk.GEMV_X_VEC for c in cands["fp8"])  # fastest on down
    assert cands["int4"][0] == (16, 2048, 4, 0)
    for scheme in ("int8", "int4"):
        assert max(bn * bk * bytes_per_weight[scheme] for bn, bk, _, v in cands[scheme]
                   if v != qk.GEMV_DOT and not v & qk.GEMV_NATIVE) >= 16384
    assert any(c[3] == qk.GEMV_DOT for c in cands["int4"])
    assert wanted <= {c[3] for c in cands["int8"]}


@pytest.mark.parametrize("scheme,group", CASES, ids=[f"{s}-g{g}" for s, g in CASES])
@pytest.mark.parametrize("m", [2, 19])
def test_qgemm(kernels: dict[str, ModuleType], scheme: str, group: int | None, m: int) -> None:
    ql = kernels["quant_linear"]
    w = ql.prepare(_weight(scheme, group, 40, 256, seed=3))
    x = _x(m, 256, seed=4)
    bias = torch.randn(40)
    for block_m, block_n, block_k in [(16, 16, 16), (16, 32, 64), (32, 16, 128)]:
        out = ql.qgemm(x, w, bias, block_m, block_n, block_k, 4, 2)
        torch.testing.assert_close(out, quant_linear_reference(x, w, bias), **TOL)


def test_apply_dispatches_every_batch_size(kernels: dict[str, ModuleType]) -> None:
    ql = kernels["quant_linear"]
    for scheme, group in CASES:
        w = ql.prepare(_weight(scheme, group, 48, 128 if group != 256 else 256, seed=5))
        for m in (0, 1, 3, 40):
            x = _x(m, w.in_features, seed=6 + m)
            out = ql.apply(x, w, None)
            assert out.shape == (m, 48)
            want = quant_linear_reference(x, w)
            if scheme == "fp8" and m > 32:
                # W8A8, activations in e4m3 too, here quantized by the interpreter's own cast
                # (off near powers of two): only the dispatch is checked here, the W8A8 sums
                # exactly in test_w8a8_fp8_dot, and the GPU within 0.05 of the definition
                assert float((out - want).norm() / want.norm()) < 0.1
            else:
                torch.testing.assert_close(out, want, **TOL)


@pytest.mark.parametrize("m", [3, 40])
def test_w8a8_fp8_dot(kernels: dict[str, ModuleType], m: int) -> None:
    """qgemm's W8A8 path on activations quantized by the reference (the interpreter's own
    fp32 -> e4m3 cast is off near powers of two; see test_fp8_activation_quantization): the
    fp8 dot and both scales give exactly the W8A8 emulation's sums."""
    from tessera.hal.quant import fp8_w8a8_reference

    ql = kernels["quant_linear"]
    w = ql.prepare(_weight("fp8", None, 40, 256, seed=15))
    x = _x(m, 256, seed=16)
    bias = torch.randn(40)
    xq, xs = quantize_activations_fp8(x)
    out = ql.qgemm(xq, w, bias, 32, 32, 32, 4, 1, w8a8=True, x_scales=xs,
                   out_dtype=torch.float32)
    torch.testing.assert_close(out, fp8_w8a8_reference(x, w, bias), **TOL)
    # K split 2 and 3 ways (8 tiles of 32: 4 + 4, 3 + 3 + 2): float32 partials with both
    # scales applied, summed with the bias once
    for split in (2, 3):
        out = ql.qgemm(xq, w, bias, 32, 32, 32, 4, 1, w8a8=True, x_scales=xs,
                       out_dtype=torch.float32, split_k=split)
        torch.testing.assert_close(out, fp8_w8a8_reference(x, w, bias), **TOL,
                                   msg=lambda msg, s=split: f"split {s}: {msg}")
    # the dots accumulating in place (FAST_ACC), whole and split: the same sums
    for split in (1, 3):
        out = ql.qgemm(xq, w, bias, 32, 32, 32, 4, 1, w8a8=True, x_scales=xs,
                       out_dtype=torch.float32, split_k=split, fast_acc=True)
        torch.testing.assert_close(out, fp8_w8a8_reference(x, w, bias), **TOL,
                                   msg=lambda msg, s=split: f"fast_acc, split {s}: {msg}")
    # and the W8A16 form (the weight converted to x's dtype), split
    out = ql.qgemm(x, w, bias, 16, 32, 64, 4, 2, split_k=2)
    torch.testing.assert_close(out, quant_linear_reference(x, w, bias), **TOL)


def test_act_order_input_permutation(kernels: dict[str, ModuleType]) -> None:
    ql = kernels["quant_linear"]
    w = _weight("int4", 32, 24, 128, seed=7)
    w.input_perm = torch.randperm(128, generator=torch.Generator().manual_seed(8))
    w = ql.prepare(w)
    for m in (1, 5):
        x = _x(m, 128, seed=9)
        torch.testing.assert_close(ql.apply(x, w, None), quant_linear_reference(x, w), **TOL)


def test_groups_not_a_power_of_two_are_split(kernels: dict[str, ModuleType]) -> None:
    ql = kernels["quant_linear"]
    w = _weight("int4", 96, 16, 192, seed=10)
    prepared = ql.prepare(w)
    assert prepared.group_size == 32 and prepared.num_groups == 6
    assert torch.equal(prepared.dequantize(), w.dequantize())
    x = _x(3, 192, seed=11)
    torch.testing.assert_close(ql.apply(x, prepared, None), quant_linear_reference(x, w), **TOL)


@pytest.mark.parametrize("block_k", [None, 64])
def test_fp8_activation_quantization(kernels: dict[str, ModuleType], block_k: int | None
                                     ) -> None:
    """Per-token fp8 quantization, a row in one block (read once) or in several (64)."""
    ql = kernels["quant_linear"]
    x = _x(5, 300, seed=12) * torch.logspace(-2, 2, 5)[:, None]
    q, scales = ql.quantize_rows_fp8(x, block_k)
    ref_q, ref_scales = quantize_activations_fp8(x)
    torch.testing.assert_close(scales, ref_scales)
    got, want = q.float(), ref_q.float()
    # Triton's interpreter (not the GPU) converts a value whose rounding carries into the next
    # binade (127.6 -> 128) to the binade below (64); those elements are left to the GPU test
    # (tests/hal_cuda/test_quant_gpu.py). Everywhere else: at most one e4m3 step apart (a tie).
    scaled = (x / ref_scales).abs()
    carried = (want.abs() > scaled) & (torch.frexp(want.abs()).mantissa == 0.5)
    diff = (got - want).abs()
    assert bool((diff <= want.abs() * 2 ** -3 + 1e-6)[~carried].all())
    assert int((~carried).sum()) > 0.9 * x.numel()


def test_store_kv_fp8(kernels: dict[str, ModuleType]) -> None:
    from tessera.hal.cpu.dense import to_cache

    gen = torch.Generator().manual_seed(13)
    k, v = torch.randn((3, 2, 24), generator=gen) * 4, torch.randn((3, 2, 24), generator=gen)
    k[0, 0, 0] = 1e5  # saturates at 448 * k_scale instead of becoming NaN
    kc = torch.zeros((16, 2, 24), dtype=torch.float8_e4m3fn)
    vc = torch.zeros_like(kc)
    slots = torch.tensor([15, 0, 6], dtype=torch.int32)
    kernels["elementwise"].store_kv(kc, vc, k, v, slots, k_scale=0.5, v_scale=0.25)
    for cache, x, scale in ((kc, k, 0.5), (vc, v, 0.25)):
        got = cache.float()[slots.long()]
        want = to_cache(x, torch.float8_e4m3fn, scale).float()
        scaled = (x / scale).abs().clamp(max=448)
        # see test_fp8_activation_quantization: the interpreter's carry into the next binade
        carried = (want.abs() > scaled) & (torch.frexp(want.abs()).mantissa == 0.5)
        assert bool(((got - want).abs() <= want.abs() * 2 ** -3 + 1e-6)[~carried].all())
        assert float(got.abs().max()) <= 448 and bool(torch.isfinite(got).all())


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_attention_reads_fp8_kv_with_scales(kernels: dict[str, ModuleType], mode: str) -> None:
    from tessera.hal.conformance_data import make_paged_case
    from tessera.hal.cpu.dense import to_cache
    from tessera.hal.reference import reference_op

    seq_lens, ext = ((1, 70, 5), (1, 1, 1)) if mode == "decode" else ((8, 40, 12), (3, 40, 4))
    case = make_paged_case(seq_lens, ext, 8, 2, 32, torch.float32, seed=14)
    ks, vs = 0.05, 0.02
    k8 = to_cache(case.k_cache, torch.float8_e4m3fn, ks)
    v8 = to_cache(case.v_cache, torch.float8_e4m3fn, vs)
    expected = reference_op("attention_extend")(
        case.q, k8.float() * ks, v8.float() * vs, case.req_to_token, case.seq_lens,
        case.extend_lens, case.qo_indptr, case.scale)
    if mode == "decode":
        out = kernels["decode_attention"].attention_decode(
            case.q, k8, v8, case.req_to_token, case.seq_lens, case.scale, k_scale=ks,
            v_scale=vs)
    else:
        out = kernels["extend_attention"].attention_extend(
            case.q, k8, v8, case.req_to_token, case.seq_lens, case.extend_lens,
            case.qo_indptr, case.scale, k_scale=ks, v_scale=vs)
    torch.testing.assert_close(out, expected, **TOL)


@pytest.mark.parametrize("group,k,packing", [(32, 256, "halves32"), (64, 256, "halves64"),
                                             (128, 384, "halves128"), (256, 512, "halves128"),
                                             (None, 96, "halves32"), (None, 200, "nibbles"),
                                             (16, 64, "nibbles")])
def test_int4_is_held_in_half_split_tiles(kernels: dict[str, ModuleType], group: int | None,
                                          k: int, packing: str) -> None:
    """prepare repacks int4 into the widest "halves<T>" tile that divides the input width and
    lies within a group (nibbles where none does); the weight it stands for is unchanged, and
    both kernels read the layout: the GEMV, qgemm, and qgemm's one-token tiles (GEMV_DOT)."""
    from tessera.hal.cuda import quant_tune

    ql = kernels["quant_linear"]
    w = _awq_offsets(_weight("int4", group or k, 24, k, seed=30), seed=31)
    prepared = ql.prepare(w)
    assert prepared.packing == packing
    assert torch.equal(prepared.dequantize(), w.dequantize())
    bias = torch.randn(24, generator=torch.Generator().manual_seed(32))
    x1 = _x(1, k, seed=33)
    want = quant_linear_reference(x1, w, bias)
    cands = _triton_gemvs(quant_tune.gemv_candidates(prepared))
    dot = [c for c in cands if c[3] & quant_tune.GEMV_DOT]
    assert bool(dot) == packing.startswith("halves")
    for cfg in cands:
        torch.testing.assert_close(quant_tune.one_token(x1, prepared, bias, cfg), want, **TOL,
                                   msg=lambda m, c=cfg: f"{c}: {m}")
    x = _x(5, k, seed=34)
    torch.testing.assert_close(ql.qgemm(x, prepared, bias, 16, 16, 64, 4, 2),
                               quant_linear_reference(x, w, bias), **TOL)


@pytest.mark.parametrize("group", [32, 128, None])
def test_int4_exponent_bit_nibbles_in_fp16(kernels: dict[str, ModuleType],
                                           group: int | None) -> None:
    """16-bit x: qgemm makes each nibble the float NIB_BIAS + q by its exponent bits and takes
    the bias back out through the row sums of x (fp16 here: the interpreter's bf16 dot is
    wrong whatever the operands, so bf16 is checked on the GPU)."""
    ql = kernels["quant_linear"]
    w = ql.prepare(_awq_offsets(_weight("int4", group or 256, 40, 256, seed=40), seed=41))
    assert w.packing.startswith("halves")
    x = _x(6, 256, seed=42)
    want = quant_linear_reference(x.half().float(), w)
    out = ql.qgemm(x.half(), w, None, 16, 32, 128, 4, 2)
    assert out.dtype == torch.float16
    assert float((out.float() - want).norm() / want.norm()) < 2e-3


@pytest.mark.parametrize("scheme,group", [("int4", 32), ("int4", None), ("fp8", None),
                                          ("int8", 32)])
def test_weights_as_first_operand(kernels: dict[str, ModuleType], scheme: str,
                                  group: int | None) -> None:
    """qgemm_wt_kernel (out^T's tile from the weight tile times x^T, stored transposed)
    computes the definition: int4 "halves" (fp32 and the fp16 exponent-bit nibbles), fp8 and
    int8 converted to x's dtype, grouped and per row, masked rows and tokens, its K whole or
    split (2 and 3 ways: float32 partials summed by splitk_sum_kernel, the bias once)."""
    ql = kernels["quant_linear"]
    w = ql.prepare(_awq_offsets(_weight(scheme, group or 256, 40, 256, seed=50), seed=51))
    bias = torch.randn(40, generator=torch.Generator().manual_seed(52))
    for m in (1, 5, 19):
        x = _x(m, 256, seed=53 + m)
        for bm, bn, bk, split in ((16, 16, 64, 1), (32, 64, 128, 1), (16, 16, 32, 3),
                                  (16, 32, 64, 2)):
            out = ql.qgemm(x, w, bias, bm, bn, bk, 4, 2, weights_as_a=True, split_k=split)
            torch.testing.assert_close(out, quant_linear_reference(x, w, bias), **TOL,
                                       msg=lambda msg, c=(bm, bn, bk, split): f"{c}: {msg}")
        if scheme == "int4":
            out16 = ql.qgemm(x.half(), w, None, 16, 32, 0, 4, 2, weights_as_a=True)
            want = quant_linear_reference(x.half().float(), w)
            assert float((out16.float() - want).norm() / want.norm()) < 2e-3


def test_every_listed_gemm_tile_runs(kernels: dict[str, ModuleType]) -> None:
    """Every several-token candidate the tuner may pick (int4 "halves" tiles, WT or not; fp8
    W8A16, WT, W8A8) computes the definition, at a batch of its bucket."""
    from tessera.hal.cuda import quant_tune

    w4 = kernels["quant_linear"].prepare(_weight("int4", 128, 24, 256, seed=60))
    w8 = kernels["quant_linear"].prepare(_weight("fp8", None, 24, 256, seed=61))
    for bucket in (16, 64, 256):
        x = _x(bucket // 4 + 3, 256, seed=62)
        for cfg in quant_tune.INT4_GEMM_CANDIDATES[bucket]:
            torch.testing.assert_close(quant_tune.run_gemm(x, w4, None, cfg),
                                       quant_linear_reference(x, w4), **TOL,
                                       msg=lambda m, c=cfg: f"{c}: {m}")
        for cfg in quant_tune.W8A8_CANDIDATES[bucket]:
            if cfg == quant_tune.SCALED_MM:
                continue  # cuBLASLt: the GPU test
            if quant_tune.is_w8a8(cfg):
                from tessera.hal.quant import fp8_w8a8_reference
                xq, xs = quantize_activations_fp8(x)
                out = kernels["quant_linear"].qgemm(xq, w8, None, *quant_tune.tile(cfg),
                                                    w8a8=True, x_scales=xs,
                                                    out_dtype=torch.float32,
                                                    split_k=quant_tune.split_k(cfg))
                want = fp8_w8a8_reference(x, w8)
            else:
                out, want = quant_tune.run_fp8(x, w8, None, cfg), quant_linear_reference(x, w8)
            torch.testing.assert_close(out, want, **TOL, msg=lambda m, c=cfg: f"{c}: {m}")


def test_every_w8a8_tile_quantizes_the_activations_and_splits_as_listed(
        kernels: dict[str, ModuleType], monkeypatch: pytest.MonkeyPatch) -> None:
    """run_fp8 under each fp8 tile flagged A8 (K split or not) quantizes the activations to
    e4m3 first, and sums float32 partials exactly when the tile lists a split: a flag or a
    split read wrongly would still compute the definition through another path."""
    from tessera.hal.cuda import quant_tune

    ql = kernels["quant_linear"]
    calls: list[str] = []
    quantize_rows, sums = ql.quantize_rows_fp8, ql.splitk_sum_kernel

    class SumRecorder:
        def __getitem__(self, grid: object) -> object:
            calls.append("sum")
            return sums[grid]

    monkeypatch.setattr(ql, "quantize_rows_fp8",
                        lambda *a, **k: calls.append("quantize") or quantize_rows(*a, **k))
    monkeypatch.setattr(ql, "splitk_sum_kernel", SumRecorder())
    w8 = ql.prepare(_weight("fp8", None, 24, 256, seed=63))
    x = _x(5, 256, seed=64)
    tiles = {c for cands in quant_tune.W8A8_CANDIDATES.values() for c in cands
             if len(c) >= 6 and c[5] == quant_tune.A8}
    assert any(len(c) == 7 for c in tiles)  # the lists hold split W8A8 tiles
    for cfg in sorted(tiles):
        calls.clear()
        quant_tune.run_fp8(x, w8, None, cfg)
        split = cfg[6] if len(cfg) == 7 else 1
        assert calls == ["quantize"] + ["sum"] * (split > 1), (cfg, calls)


@pytest.mark.parametrize("scheme,group,k", [("int4", 32, 256), ("int4", None, 256),
                                            ("int4", 16, 64), ("int4", None, 200),
                                            ("int8", 32, 256), ("int8", None, 200),
                                            ("fp8", None, 200)])
def test_dequantize_weight_is_the_definition(kernels: dict[str, ModuleType], scheme: str,
                                             group: int | None, k: int) -> None:
    """dequant_kernel (DEQUANT_MM's expansion) gives the weight the scheme defines, for every
    layout the plugin holds ("halves" tiles, interleaved nibbles, grouped, per row), and
    DEQUANT_MM computes the linear through it."""
    from tessera.hal.cuda import quant_tune

    ql = kernels["quant_linear"]
    w = ql.prepare(_awq_offsets(_weight(scheme, group or k, 37, k, seed=70), seed=71))
    torch.testing.assert_close(ql.dequantize_weight(w, torch.float32), w.dequantize())
    x = _x(9, k, seed=72)
    bias = torch.randn(37, generator=torch.Generator().manual_seed(73))
    torch.testing.assert_close(quant_tune.run_gemm(x, w, bias, quant_tune.DEQUANT_MM),
                               quant_linear_reference(x, w, bias), **TOL)


@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_quant_fp8_is_the_composition(kernels: dict[str, ModuleType],
                                               with_residual: bool) -> None:
    """rms_norm_quant_fp8: rms_norm (fused_add_rms_norm with a residual) then
    quantize_rows_fp8 of its output, the same e4m3 values and scales, the residual exactly
    fused_add_rms_norm's; rows of very different sizes, a width no power of two."""
    norm, ql = kernels["norm"], kernels["quant_linear"]
    x = _x(6, 300, seed=40) * torch.logspace(-3, 2, 6)[:, None]
    gain = torch.rand(300, generator=torch.Generator().manual_seed(41)) + 0.5
    res = _x(6, 300, seed=42) if with_residual else None
    q, scales, res_out = norm.rms_norm_quant_fp8(x, gain, 1e-5, res)
    if res is None:
        h, want_res = norm.rms_norm(x, gain, 1e-5), None
    else:
        h, want_res = norm.fused_add_rms_norm(x, res, gain, 1e-5)
    want_q, want_scales = ql.quantize_rows_fp8(h)
    assert q.dtype == torch.float8_e4m3fn and scales.shape == (6, 1)
    assert torch.equal(scales, want_scales) and torch.equal(q.float(), want_q.float())
    assert (res_out is None) == (res is None)
    if res_out is not None:
        assert torch.equal(res_out, want_res)
    with pytest.raises(ValueError, match="rms_norm_quant_fp8"):
        norm.rms_norm_quant_fp8(x, gain, 1e-5, res[:, :10] if res is not None else x.t())


def test_silu_and_mul_quant_fp8_is_the_composition(kernels: dict[str, ModuleType]) -> None:
    """silu_and_mul_quant_fp8: silu_and_mul then quantize_rows_fp8, the same values; a
    width past QUANT_ROW_MAX refused."""
    ew, ql = kernels["elementwise"], kernels["quant_linear"]
    x = _x(5, 2 * 200, seed=43) * 4
    q, scales = ew.silu_and_mul_quant_fp8(x)
    want_q, want_scales = ql.quantize_rows_fp8(ew.silu_and_mul(x))
    assert torch.equal(scales, want_scales) and torch.equal(q.float(), want_q.float())
    with pytest.raises(ValueError, match="silu_and_mul_quant_fp8"):
        ew.silu_and_mul_quant_fp8(torch.zeros((1, 2 * ew.QUANT_ROW_MAX + 2)))


@pytest.mark.parametrize("m", [8, 40])  # the interpreter's fp8 pick: W8A16 to 32, W8A8 beyond
@pytest.mark.parametrize("fusion", ["norm", "norm+residual", "silu"])
def test_rows_fused_is_the_composition(kernels: dict[str, ModuleType],
                                       monkeypatch: pytest.MonkeyPatch, m: int,
                                       fusion: str) -> None:
    """rows_fused: where the fp8 product is W8A8 (40 tokens here) the norm's or the SiLU's
    kernel quantizes the activations, no quantize_rows_fp8 launch, and the output equals the
    composition's (the same e4m3 activations into the same product); at 8 tokens (W8A16),
    for other schemes and with HAL_CUDA_FP8_ROWS_FUSION off, the composition itself. Misused
    (no op, both, a residual without a norm): a clear error."""
    ql, norm, ew = kernels["quant_linear"], kernels["norm"], kernels["elementwise"]
    k = 96
    x = _x(m, 2 * k if fusion == "silu" else k, seed=44)
    gain = torch.rand(k, generator=torch.Generator().manual_seed(45)) + 0.5
    res = _x(m, k, seed=46) if fusion == "norm+residual" else None
    kw: dict = {"silu": True} if fusion == "silu" else {"norm": (gain, 1e-5),
                                                         "residual": res}
    bias = torch.randn(80, generator=torch.Generator().manual_seed(47))

    def composed(w: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor | None]:
        if fusion == "silu":
            return ql.apply(ew.silu_and_mul(x), w, bias), None
        if res is None:
            return ql.apply(norm.rms_norm(x, gain, 1e-5), w, bias), None
        h, r = norm.fused_add_rms_norm(x, res, gain, 1e-5)
        return ql.apply(h, w, bias), r

    calls = {"quantize_rows_fp8": 0}
    real = ql.quantize_rows_fp8

    def counted(*a: object, **kw_: object) -> object:
        calls["quantize_rows_fp8"] += 1
        return real(*a, **kw_)

    for scheme in ("fp8", "int8"):
        w = ql.prepare(_weight(scheme, None if scheme == "fp8" else 32, 80, k, seed=48))
        want, want_res = composed(w)
        monkeypatch.setattr(ql, "quantize_rows_fp8", counted)
        calls["quantize_rows_fp8"] = 0
        got, got_res = ql.rows_fused(x, w, bias, **kw)
        monkeypatch.setattr(ql, "quantize_rows_fp8", real)
        assert torch.equal(got, want)
        assert (got_res is None) == (want_res is None)
        if want_res is not None:
            assert torch.equal(got_res, want_res)
        # fused (fp8 at 40 tokens): the norm or the SiLU quantized, the product did not; the
        # compositions (W8A16, int8) quantize nothing
        assert calls["quantize_rows_fp8"] == 0
        if scheme == "fp8":
            config = ql.quant_tune.fp8_config(w, x[:, :k], bias)
            assert ql.quant_tune.is_w8a8(config) == (m > 32)
    ql.rows_fusion_on.cache_clear()
    monkeypatch.setenv("HAL_CUDA_FP8_ROWS_FUSION", "0")
    try:
        w = ql.prepare(_weight("fp8", None, 80, k, seed=48))
        monkeypatch.setattr(ql, "quantize_rows_fp8", counted)
        calls["quantize_rows_fp8"] = 0
        got, _ = ql.rows_fused(x, w, bias, **kw)
        monkeypatch.setattr(ql, "quantize_rows_fp8", real)
        assert torch.equal(got, composed(w)[0])
        assert calls["quantize_rows_fp8"] == int(m > 32)  # off: the product quantizes
    finally:
        ql.rows_fusion_on.cache_clear()
    for bad in ({}, {"norm": (gain, 1e-5), "silu": True}, {"residual": x, "silu": True}):
        with pytest.raises(ValueError, match="rows_fused"):
            ql.rows_fused(x, w, bias, **bad)


def test_in_place_fp8_sums_only_over_bounded_runs() -> None:
    """A8F tiles (the fp8 dots accumulating in the tensor cores) are offered only where their
    K split keeps each accumulated run within A8F_MAX_RUN inputs; the promoting tiles and
    cuBLASLt everywhere, and none at 256 tokens (the bucket prefill chunks use)."""
    from tessera.hal.cuda import quant_tune as qt

    a8f = [c for bucket in (32, 64, 128) for c in qt.W8A8_CANDIDATES[bucket]
           if len(c) >= 6 and c[5] == qt.A8F]
    assert a8f and all(qt.is_w8a8(c) for c in a8f)
    assert not any(len(c) >= 6 and c[5] == qt.A8F for c in qt.W8A8_CANDIDATES[256])
    assert qt.a8f_fits((64, 64, 128, 4, 4, qt.A8F), 4096)
    assert not qt.a8f_fits((64, 64, 128, 4, 4, qt.A8F), 14336)
    assert not qt.a8f_fits((64, 64, 128, 4, 4, qt.A8F, 2), 14336)
    assert qt.a8f_fits((64, 64, 128, 4, 4, qt.A8F, 4), 14336)
    assert qt.a8f_fits((64, 64, 128, 4, 4, qt.A8, 1), 14336) and qt.a8f_fits(qt.SCALED_MM, 1 << 20)
