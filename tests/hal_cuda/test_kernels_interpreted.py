"""The cuda plugin's Triton kernels on the CPU (Triton's interpreter), fp32, small shapes,
against the reference ops (hal/cpu, the conformance oracle)."""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType

import pytest
import torch

from tessera.hal.conformance_data import make_paged_case, pad_paged_case
from tessera.hal.reference import reference_op
from tessera.hal.rope import cos_sin_cache

TOL = {"atol": 1e-5, "rtol": 1e-5}
_E4M3_WORDS_TO_F16 = None  # set by test_e4m3_words_bits_convert_exactly


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def test_rms_norm(kernels: dict[str, ModuleType]) -> None:
    x, w = _rand(5, 96, seed=1) * 3, _rand(96, seed=2)  # 96: not a power of two (masking)
    out = kernels["norm"].rms_norm(x, w, 1e-6)
    torch.testing.assert_close(out, reference_op("rms_norm")(x, w, 1e-6), **TOL)
    assert kernels["norm"].rms_norm(x[:0], w, 1e-6).shape == (0, 96)


@pytest.mark.parametrize("rows,cols", [(4, 64), (3, 96), (0, 64)])
def test_fused_add_rms_norm(kernels: dict[str, ModuleType], rows: int, cols: int) -> None:
    """One launch returns both the new residual and its norm; 96 is not a power of two
    (masked columns must not enter the mean)."""
    x, res, w = _rand(rows, cols, seed=3), _rand(rows, cols, seed=4), _rand(cols, seed=5)
    out, res_out = kernels["norm"].fused_add_rms_norm(x, res, w, 1e-5)
    ref_out, ref_res = reference_op("fused_add_rms_norm")(x, res, w, 1e-5)
    assert out.shape == res_out.shape == (rows, cols)
    torch.testing.assert_close(res_out, ref_res, **TOL)
    torch.testing.assert_close(out, ref_out, **TOL)


def test_fused_add_rms_norm_on_row_views(kernels: dict[str, ModuleType]) -> None:
    """x and the residual as row-strided views (rows of wider buffers), inputs unchanged."""
    x_buf, res_buf, w = _rand(5, 160, seed=6), _rand(5, 192, seed=7), _rand(96, seed=8)
    x, res = x_buf[:, 32:128], res_buf[:, :96]
    x_before, res_before = x.clone(), res.clone()
    out, res_out = kernels["norm"].fused_add_rms_norm(x, res, w, 1e-6)
    ref_out, ref_res = reference_op("fused_add_rms_norm")(x_before, res_before, w, 1e-6)
    torch.testing.assert_close(res_out, ref_res, **TOL)
    torch.testing.assert_close(out, ref_out, **TOL)
    assert torch.equal(x, x_before) and torch.equal(res, res_before)


@pytest.mark.parametrize("hq,hk,dim", [(4, 2, 32), (3, 1, 24)])
def test_rotary_embedding_on_strided_views(kernels: dict[str, ModuleType], hq: int, hk: int,
                                           dim: int) -> None:
    table = cos_sin_cache(dim, 256, 10000.0, None, "cpu", torch.float32)
    positions = torch.tensor([0, 7, 255, 31])
    # q and k as views into one fused QKV output, as the model produces them
    qkv = _rand(4, (hq + 2 * hk) * dim, seed=6)
    q = qkv[:, :hq * dim].view(4, hq, dim)
    k = qkv[:, hq * dim:(hq + hk) * dim].view(4, hk, dim)
    q_out, k_out = kernels["elementwise"].rotary_embedding(positions, q, k, table)
    q_ref, k_ref = reference_op("rotary_embedding")(positions, q, k, table)
    torch.testing.assert_close(q_out, q_ref, **TOL)
    torch.testing.assert_close(k_out, k_ref, **TOL)


def test_silu_and_mul(kernels: dict[str, ModuleType]) -> None:
    x = _rand(3, 2 * 80, seed=7) * 2
    torch.testing.assert_close(kernels["elementwise"].silu_and_mul(x),
                               reference_op("silu_and_mul")(x), **TOL)


def test_gelu_tanh_and_mul(kernels: dict[str, ModuleType]) -> None:
    x = _rand(3, 2 * 80, seed=7) * 4  # reaches the flat tails of tanh
    torch.testing.assert_close(kernels["elementwise"].gelu_tanh_and_mul(x),
                               reference_op("gelu_tanh_and_mul")(x), **TOL)


@pytest.mark.parametrize("tokens,experts,top_k", [(1, 8, 2), (7, 5, 2), (80, 4, 3)])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_fused_moe(kernels: dict[str, ModuleType], tokens: int, experts: int, top_k: int,
                   activation: str) -> None:
    hidden, inner = 48, 40  # not powers of two: the masks matter
    x = _rand(tokens, hidden, seed=30)
    w13 = _rand(experts, 2 * inner, hidden, seed=31) / hidden ** 0.5
    w2 = _rand(experts, hidden, inner, seed=32) / inner ** 0.5
    weights, ids = torch.softmax(_rand(tokens, experts, seed=33), -1).topk(top_k, dim=-1)
    ids = ids.to(torch.int32)
    if tokens > 1:
        ids[0, 0], ids[1, -1] = -1, experts  # not held by this rank: nothing added
    out = kernels["moe"].fused_moe(x, w13, w2, weights, ids, activation)
    torch.testing.assert_close(out, reference_op("fused_moe")(x, w13, w2, weights, ids,
                                                              activation), **TOL)


def _moe_case(tokens: int, experts: int, top_k: int, hidden: int, inner: int, seed: int
              ) -> tuple[torch.Tensor, ...]:
    """x, w13, w2 and a routing that never picks the last expert (its weights must not enter)
    and, from 3 tokens, drops two pairs (experts of another rank)."""
    x = _rand(tokens, hidden, seed=seed)
    w13 = _rand(experts, 2 * inner, hidden, seed=seed + 1) / hidden ** 0.5
    w2 = _rand(experts, hidden, inner, seed=seed + 2) / inner ** 0.5
    scores = _rand(tokens, experts, seed=seed + 3)
    scores[:, -1] = float("-inf")
    weights, ids = torch.softmax(scores, -1).topk(top_k, dim=-1)
    ids = ids.to(torch.int32)
    if tokens > 2:
        ids[0, 0], ids[2, -1] = -1, experts
    assert not (ids == experts - 1).any()
    return x, w13, w2, weights, ids


def test_fused_moe_every_candidate_tile(kernels: dict[str, ModuleType]) -> None:
    """Every tile moe_tune may choose, forced on both GEMMs, against the reference at 1-100
    tokens, top-1 and top-2, both activations. The interpreter ignores num_warps and
    num_stages, so each (BLOCK_M, BLOCK_N, BLOCK_K) runs once; hidden 144 loops over K with
    BLOCK_K 64 and 128, and 144, 2 * 40 and 40 leave every tile partly masked."""
    acts = ("silu", "gelu_tanh")
    from tessera.hal.cuda import moe_tune

    moe = kernels["moe"]
    tiles = {t[:3]: t for bucket in moe_tune.BUCKETS.values() for t in bucket}
    assert len(tiles) >= 12
    cases = []  # per token count, (case, want) per activation
    for i, tokens in enumerate((1, 3, 17, 64, 100)):
        case = _moe_case(tokens, 5, 1 + i % 2, 144, 40, seed=40 + i)
        cases.append([(case, act, reference_op("fused_moe")(*case, act)) for act in acts])
    for j, tile in enumerate(tiles.values()):
        for i, per_act in enumerate(cases):  # the activation alternates with the token count
            case, activation, want = per_act[(i + j) % 2]
            out = moe.fused_moe(*case, activation, tiles=moe.MoETiles(tile, tile))
            torch.testing.assert_close(out, want, **TOL,
                                       msg=lambda m, t=tile, c=case: f"{t} at {len(c[0])} "
                                       f"tokens: {m}")


def test_fused_moe_refuses_tiles_of_two_alignments(kernels: dict[str, ModuleType]) -> None:
    moe = kernels["moe"]
    case = _moe_case(3, 4, 2, 48, 40, seed=50)
    with pytest.raises(ValueError, match="BLOCK_M"):
        moe.fused_moe(*case, tiles=moe.MoETiles((16, 32, 64, 4, 3), (32, 32, 64, 4, 3)))


def test_moe_alignment_groups_pairs_by_expert(kernels: dict[str, ModuleType]) -> None:
    ids = torch.tensor([[2, 0], [2, 1], [-1, 2]], dtype=torch.int32)
    align = kernels["moe"].align_by_expert(ids, 3, 16)
    blocks = align.sorted_pairs.view(-1, 16)
    assert align.block_expert.tolist()[:3] == [0, 1, 2]
    assert set(align.block_expert.tolist()[3:]) <= {-1}
    pad = ids.numel()
    for b, expert in enumerate(align.block_expert.tolist()[:3]):
        pairs = [p for p in blocks[b].tolist() if p != pad]
        assert pairs == [p for p in range(pad) if ids.view(-1)[p] == expert]  # stable order
    assert (blocks[3:] == pad).all()  # the pair of expert -1 is dropped


@pytest.mark.parametrize("tokens,experts,top_k,block_m",
                         [(1, 8, 2, 16), (3, 3, 2, 16), (7, 5, 2, 16), (80, 4, 3, 32),
                          (1, 256, 8, 16), (300, 8, 2, 64), (17, 60, 6, 16), (1024, 8, 2, 128)])
def test_moe_alignment_kernel_equals_the_ops(kernels: dict[str, ModuleType], tokens: int,
                                             experts: int, top_k: int, block_m: int) -> None:
    """The one-launch alignment (decode-sized batches) against the torch ops it replaces:
    the same slots for every pair, in order, the same padding and block experts, with
    pairs of other ranks' experts (-1, E) dropped; int32 and int64 ids."""
    moe = kernels["moe"]
    gen = torch.Generator().manual_seed(tokens * 1000 + experts)
    for dtype in (torch.int32, torch.int64):
        ids = torch.randint(-1, experts + 1, (tokens, top_k), generator=gen).to(dtype)
        got = moe.align_by_expert_kernel(ids, experts, block_m)
        want = moe.align_by_expert_ops(ids, experts, block_m)
        assert torch.equal(got.sorted_pairs, want.sorted_pairs), (tokens, experts, dtype)
        assert torch.equal(got.block_expert, want.block_expert), (tokens, experts, dtype)
        assert got.block_m == want.block_m == block_m
    # align_by_expert takes the kernel up to its bound, the ops beyond
    small = torch.zeros((moe.ALIGN_KERNEL_MAX_PAIRS // 2, 2), dtype=torch.int32)
    assert torch.equal(moe.align_by_expert(small, 4, 16).sorted_pairs,
                       moe.align_by_expert_ops(small, 4, 16).sorted_pairs)


def test_moe_combine_sums_held_choices_and_skips_unwritten_rows(
        kernels: dict[str, ModuleType]) -> None:
    """The rows of choices this rank does not hold are never written by the down GEMM: the
    combine must leave them out whatever they hold (NaN here), and sum the rest in fp32."""
    moe = kernels["moe"]
    tokens, top_k, hidden, experts = 4, 3, 40, 5
    gen = torch.Generator().manual_seed(80)
    rows = torch.randn((tokens * top_k, hidden), generator=gen)
    ids = torch.randint(0, experts, (tokens, top_k), generator=gen, dtype=torch.int32)
    ids[0, 1], ids[2, 0], ids[3, 2] = -1, experts, experts + 3  # other ranks' experts
    held = (ids >= 0) & (ids < experts)
    rows.view(tokens, top_k, hidden)[~held] = float("nan")
    got = moe.combine_choices(rows, ids, experts, torch.float32)
    want = torch.where(held[:, :, None], rows.view(tokens, top_k, hidden), 0.0).sum(dim=1)
    torch.testing.assert_close(got, want, **TOL)
    assert torch.isfinite(got).all()


def test_store_kv_writes_only_its_slots(kernels: dict[str, ModuleType]) -> None:
    k_cache, v_cache = _rand(16, 2, 24, seed=8), _rand(16, 2, 24, seed=9)
    k, v = _rand(3, 2, 24, seed=10), _rand(3, 2, 24, seed=11)
    slots = torch.tensor([15, 0, 6], dtype=torch.int32)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    expected_k[slots.long()], expected_v[slots.long()] = k, v
    kernels["elementwise"].store_kv(k_cache, v_cache, k, v, slots)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("heads_first", [True, False])  # stage 1's grid order
@pytest.mark.parametrize("hq,hk", [(4, 4), (8, 2), (8, 1)])
def test_attention_decode(kernels: dict[str, ModuleType], monkeypatch: pytest.MonkeyPatch,
                          hq: int, hk: int, heads_first: bool) -> None:
    monkeypatch.setattr(kernels["decode_attention"], "HEADS_FIRST", heads_first)
    # 70 and 129 cross the 64-token blocks; 1 leaves most splits empty.
    seq_lens = (1, 70, 5, 129)
    case = make_paged_case(seq_lens, (1,) * 4, hq, hk, 32, torch.float32, seed=12)
    expected = reference_op("attention_extend")(
        case.q, case.k_cache, case.v_cache, case.req_to_token, case.seq_lens, case.extend_lens,
        case.qo_indptr, case.scale)
    decode = kernels["decode_attention"].attention_decode
    for splits in (1, 3, 8):
        out = decode(case.q, case.k_cache, case.v_cache, case.req_to_token, case.seq_lens,
                     case.scale, splits=splits)
        torch.testing.assert_close(out, expected, **TOL)


@pytest.mark.parametrize("tile", [None, (32, 2, 3, 128), (16, 2, 4, 128)])
@pytest.mark.parametrize("dim", [32, 24, 15])
def test_attention_decode_fp8_cache(kernels: dict[str, ModuleType], monkeypatch: pytest.MonkeyPatch,
                                    dim: int, tile: tuple[int, int, int, int] | None) -> None:
    """An e4m3 cache: even rows are read as uint16 words of two elements (their bits moved into
    float16, exactly, then fp32 as q), an odd row (15) element by element; against the fp32
    reference over the values the cache holds. At the default tile and at tiles with a
    register cap (FP8_MAXNREG, passed to the launch as Triton's maxnreg)."""
    if tile is not None:
        monkeypatch.setattr(kernels["decode_attention"], "FP8_SMALL_TILE", None)
        for name, value in zip(("FP8_BLOCK_N", "FP8_NUM_WARPS", "FP8_NUM_STAGES",
                                "FP8_MAXNREG"), tile, strict=True):
            monkeypatch.setattr(kernels["decode_attention"], name, value)
    seq_lens = (1, 70, 5, 129)
    case = make_paged_case(seq_lens, (1,) * 4, 8, 2, dim, torch.float32, seed=15)
    k8 = (case.k_cache * 16).to(torch.float8_e4m3fn)  # normals, subnormals, both signs
    v8 = (case.v_cache * 16).to(torch.float8_e4m3fn)
    expected = reference_op("attention_extend")(
        case.q, k8.float() / 16, v8.float() / 16, case.req_to_token, case.seq_lens,
        case.extend_lens, case.qo_indptr, case.scale)
    da = kernels["decode_attention"]
    assert da.fp8_words(k8) == (dim % 2 == 0)
    for splits in (1, 3):
        out = da.attention_decode(case.q, k8, v8, case.req_to_token, case.seq_lens, case.scale,
                                  splits=splits, k_scale=1 / 16, v_scale=1 / 16)
        torch.testing.assert_close(out, expected, **TOL)


def test_the_fp8_tile_follows_the_batch(kernels: dict[str, ModuleType]) -> None:
    """FP8_SMALL_TILE from FP8_SMALL_BATCH[0] to [1] requests over fp8 words, the default tile
    elsewhere and over other caches; and a batch of that size against the reference."""
    da = kernels["decode_attention"]
    lo, hi = da.FP8_SMALL_BATCH
    default = (da.FP8_BLOCK_N, da.FP8_NUM_WARPS, da.FP8_NUM_STAGES, da.FP8_MAXNREG)
    assert da.FP8_SMALL_TILE is not None and da.FP8_SMALL_TILE != default
    assert [da.tunables(True, b) for b in (1, lo - 1, lo, hi, hi + 1, 256)] == \
        [default, default, da.FP8_SMALL_TILE, da.FP8_SMALL_TILE, default, default]
    assert da.tunables(False, lo)[:3] == (da.BLOCK_N, da.NUM_WARPS, da.NUM_STAGES)
    seq_lens = tuple(9 * (i % 5) + 1 for i in range(lo))
    case = make_paged_case(seq_lens, (1,) * lo, 4, 1, 16, torch.float32, seed=33)
    k8, v8 = (case.k_cache * 16).to(torch.float8_e4m3fn), (case.v_cache * 16).to(
        torch.float8_e4m3fn)
    expected = reference_op("attention_extend")(
        case.q, k8.float() / 16, v8.float() / 16, case.req_to_token, case.seq_lens,
        case.extend_lens, case.qo_indptr, case.scale)
    out = da.attention_decode(case.q, k8, v8, case.req_to_token, case.seq_lens, case.scale,
                              k_scale=1 / 16, v_scale=1 / 16)
    torch.testing.assert_close(out, expected, **TOL)


def test_attention_over_fp8_caches_without_a_word_view(kernels: dict[str, ModuleType]) -> None:
    """An fp8 cache whose view as words does not exist (a slice at an odd byte offset) is
    read element by element, decode and extend alike, and gives the same result."""
    seq_lens, extend_lens = (80, 13, 5), (75, 1, 1)
    case = make_paged_case(seq_lens, extend_lens, 8, 2, 32, torch.float32, seed=23)
    wide_k = torch.zeros(case.k_cache.shape[:-1] + (33,), dtype=torch.float8_e4m3fn)
    wide_v = torch.zeros_like(wide_k)
    k8, v8 = wide_k[..., 1:], wide_v[..., 1:]
    k8.copy_((case.k_cache * 16).to(torch.float8_e4m3fn))
    v8.copy_((case.v_cache * 16).to(torch.float8_e4m3fn))
    da = kernels["decode_attention"]
    assert not da.fp8_words(k8, v8) and da.fp8_words(k8.contiguous(), v8.contiguous())
    args = (case.req_to_token, case.seq_lens, case.extend_lens, case.qo_indptr, case.scale)
    expected = reference_op("attention_extend")(case.q, k8.float() / 16, v8.float() / 16,
                                                *args)
    for k, v in ((k8, v8), (k8.contiguous(), v8.contiguous())):
        out = kernels["extend_attention"].attention_extend(case.q, k, v, *args,
                                                           k_scale=1 / 16, v_scale=1 / 16)
        torch.testing.assert_close(out, expected, **TOL)


def test_e4m3_words_bits_convert_exactly(kernels: dict[str, ModuleType]) -> None:
    """The interpreter's conversion of a uint16 word (two e4m3 values) by moving bits gives
    2^-8 of torch's e4m3 -> float16 for every word, NaN patterns aside."""
    import triton
    import triton.language as tl

    global _E4M3_WORDS_TO_F16  # a jitted function resolves the names it calls as globals
    _E4M3_WORDS_TO_F16 = kernels["decode_attention"].e4m3_words_to_f16

    @triton.jit
    def convert(w_ptr, out_ptr):
        rows = tl.arange(0, 16)
        w = tl.load(w_ptr + rows[:, None] * 64 + tl.arange(0, 64)[None, :])
        out = _E4M3_WORDS_TO_F16(w, 16, 128, False)
        tl.store(out_ptr + rows[:, None] * 128 + tl.arange(0, 128)[None, :], out)

    words = torch.arange(65536, dtype=torch.int32).to(torch.uint16).view(-1, 16, 64)
    want = words.view(torch.float8_e4m3fn).to(torch.float16).float() * 2 ** -8
    finite = ~want.isnan()
    for i in range(words.shape[0]):
        out = torch.empty((16, 128), dtype=torch.float16)
        convert[(1,)](words[i].contiguous(), out)
        assert torch.equal(out.float()[finite[i]], want[i][finite[i]]), i


def test_attention_decode_empty_batch(kernels: dict[str, ModuleType]) -> None:
    case = make_paged_case((), (), 4, 2, 32, torch.float32, seed=13)
    out = kernels["decode_attention"].attention_decode(
        case.q, case.k_cache, case.v_cache, case.req_to_token, case.seq_lens, case.scale)
    assert out.shape == (0, 4, 32)


@pytest.mark.parametrize("seq_lens,extend_lens", [
    ((5, 70, 16), (5, 70, 16)),  # plain prefill, one request longer than a block
    ((80, 13, 12), (75, 1, 4)),  # cached prefixes 5, 12, 8; a chunk crossing blocks
    ((1, 17, 4), (1, 6, 1)),  # mixed decode and extend rows
])
def test_attention_extend(kernels: dict[str, ModuleType], seq_lens: tuple[int, ...],
                          extend_lens: tuple[int, ...]) -> None:
    case = make_paged_case(seq_lens, extend_lens, 8, 2, 32, torch.float32, seed=14)
    args = (case.q, case.k_cache, case.v_cache, case.req_to_token, case.seq_lens,
            case.extend_lens, case.qo_indptr, case.scale)
    out = kernels["extend_attention"].attention_extend(*args)
    torch.testing.assert_close(out, reference_op("attention_extend")(*args), **TOL)


@pytest.mark.parametrize("dim,window,cap", [(32, 0, 0.0), (24, 40, 0.0), (32, 0, 0.7),
                                            (15, 0, 0.0)])
def test_attention_extend_fp8_cache(kernels: dict[str, ModuleType], dim: int, window: int,
                                    cap: float) -> None:
    """A mixed batch over an e4m3 cache (words for even rows, elements for the odd 15), with a
    cached prefix, a chunk crossing blocks and decode rows, a window and a cap; against the
    fp32 reference over the values the cache holds."""
    seq_lens, extend_lens = (80, 13, 12, 70), (75, 1, 4, 1)
    case = make_paged_case(seq_lens, extend_lens, 8, 2, dim, torch.float32, seed=22)
    k8 = (case.k_cache * 16).to(torch.float8_e4m3fn)
    v8 = (case.v_cache * 16).to(torch.float8_e4m3fn)
    kw = {"sliding_window": window, "logit_cap": cap}
    expected = reference_op("attention_extend")(
        case.q, k8.float() / 16, v8.float() / 16, case.req_to_token, case.seq_lens,
        case.extend_lens, case.qo_indptr, case.scale, **kw)
    out = kernels["extend_attention"].attention_extend(
        case.q, k8, v8, case.req_to_token, case.seq_lens, case.extend_lens, case.qo_indptr,
        case.scale, k_scale=1 / 16, v_scale=1 / 16, **kw)
    torch.testing.assert_close(out, expected, **TOL)


# 70: tiles wholly inside every row's window run unmasked between masked ones
@pytest.mark.parametrize("window,cap", [(5, 0.0), (40, 0.0), (70, 0.0), (0, 0.7), (33, 1.1)])
def test_attention_sliding_window_and_soft_cap(kernels: dict[str, ModuleType], window: int,
                                               cap: float) -> None:
    """Windows inside one 32-row fp32 block and across blocks, decode rows mixed in; caps
    below the scores' scale."""
    seq_lens, extend_lens = (80, 13, 12, 70), (75, 1, 4, 1)
    case = make_paged_case(seq_lens, extend_lens, 8, 2, 32, torch.float32, seed=20)
    kw = {"sliding_window": window, "logit_cap": cap}
    args = (case.q, case.k_cache, case.v_cache, case.req_to_token, case.seq_lens,
            case.extend_lens, case.qo_indptr, case.scale)
    out = kernels["extend_attention"].attention_extend(*args, **kw)
    torch.testing.assert_close(out, reference_op("attention_extend")(*args, **kw), **TOL)
    dec = make_paged_case(seq_lens, (1,) * 4, 8, 2, 32, torch.float32, seed=21)
    dargs = (dec.q, dec.k_cache, dec.v_cache, dec.req_to_token, dec.seq_lens, dec.scale)
    for splits in (1, 3):
        out = kernels["decode_attention"].attention_decode(*dargs, splits=splits, **kw)
        torch.testing.assert_close(out, reference_op("attention_decode")(*dargs, **kw), **TOL)


# The tiny Gemma 2 of the model tests: (seq_lens, extend_lens) of its first two steps with
# prompts of 1, 3, 7, 12, ... tokens in chunks of 10 (one-token extends and chunks together)
GEMMA2_STEPS = (((1, 3, 6, 1, 1, 1, 1, 1), (1, 3, 6, 1, 1, 1, 1, 1)),
                ((2, 4, 7, 10, 2, 2, 2, 2), (1, 1, 1, 9, 1, 1, 1, 1)))


@pytest.mark.parametrize("window", [10, 0])  # its sliding and its global layer
def test_attention_gemma2_tiny_steps(kernels: dict[str, ModuleType], window: int) -> None:
    """Head dim 16, 4 query heads on 2 KV heads, scale 1 (query_pre_attn_scalar 1: scores
    far past the cap of 2, tanh saturated): its chunked steps, then decodes on both sides of
    the window."""
    kw = {"sliding_window": window, "logit_cap": 2.0}
    for i, (seq_lens, extend_lens) in enumerate(GEMMA2_STEPS):
        case = replace(make_paged_case(seq_lens, extend_lens, 4, 2, 16, torch.float32,
                                       seed=40 + i), scale=1.0)
        args = (case.q, case.k_cache, case.v_cache, case.req_to_token, case.seq_lens,
                case.extend_lens, case.qo_indptr, case.scale)
        out = kernels["extend_attention"].attention_extend(*args, **kw)
        torch.testing.assert_close(out, reference_op("attention_extend")(*args, **kw), **TOL)
    dec = replace(make_paged_case((8, 10, 11, 12, 40, 45), (1,) * 6, 4, 2, 16, torch.float32,
                                  seed=42), scale=1.0)
    dargs = (dec.q, dec.k_cache, dec.v_cache, dec.req_to_token, dec.seq_lens, dec.scale)
    for splits in (1, 3):
        out = kernels["decode_attention"].attention_decode(*dargs, splits=splits, **kw)
        torch.testing.assert_close(out, reference_op("attention_decode")(*dargs, **kw), **TOL)


@pytest.mark.parametrize("head_dim", [32, 24])  # 24: the head-dim mask of unmasked tiles
def test_attention_extend_chunk_after_long_prefix(kernels: dict[str, ModuleType],
                                                  head_dim: int) -> None:
    """A chunk after a prefix of several key tiles: the tiles before each query block run
    without position masks, the rest with them."""
    case = make_paged_case((100, 71), (40, 71), 4, 2, head_dim, torch.float32, seed=24)
    args = (case.q, case.k_cache, case.v_cache, case.req_to_token, case.seq_lens,
            case.extend_lens, case.qo_indptr, case.scale)
    out = kernels["extend_attention"].attention_extend(*args)
    torch.testing.assert_close(out, reference_op("attention_extend")(*args), **TOL)


@pytest.mark.parametrize("spare", [16, 0])  # 0: fewer programs than blocks, each loops
def test_attention_extend_static_launch_with_padding(kernels: dict[str, ModuleType],
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     spare: int) -> None:
    """Decode rows interleaved with chunks of several blocks (fp32 blocks are 32 rows), more
    requests than one 16-wide lookup vector, then the same batch padded as a captured step
    pads it: the real rows are the reference's and identical with and without padding, the
    padding rows are zeros."""
    monkeypatch.setattr(kernels["extend_attention"], "SPARE_PROGRAMS", spare)
    extend = (1, 70, 1, 33, 2, 1, 64, 1, 1, 5, 1, 1, 40, 1, 1, 1, 3, 1, 1, 1)
    prefix = (9, 0, 130, 12, 3, 1, 0, 64, 7, 31, 2, 90, 5, 16, 1, 4, 60, 11, 0, 33)
    seq_lens = tuple(p + e for p, e in zip(prefix, extend, strict=True))
    case = make_paged_case(seq_lens, extend, 4, 2, 32, torch.float32, seed=18)
    run = kernels["extend_attention"].attention_extend
    args = (case.q, case.k_cache, case.v_cache, case.req_to_token, case.seq_lens,
            case.extend_lens, case.qo_indptr, case.scale)
    out = run(*args)
    torch.testing.assert_close(out, reference_op("attention_extend")(*args), **TOL)
    padded = pad_paged_case(case, tokens=37, requests=3, seed=19)
    out_padded = run(padded.q, padded.k_cache, padded.v_cache, padded.req_to_token,
                     padded.seq_lens, padded.extend_lens, padded.qo_indptr, case.scale)
    t = case.q.shape[0]
    assert torch.equal(out_padded[:t], out)
    assert torch.equal(out_padded[t:], torch.zeros_like(out_padded[t:]))
    # The decode rows alone, merged from several splits or written at once from one.
    decode_rows = case.qo_indptr[:-1][case.extend_lens == 1].long()
    for splits in (1, 3):
        only = torch.full_like(out, 7.0)
        kernels["decode_attention"].launch_decode(
            case.q, case.k_cache, case.v_cache, case.req_to_token, case.seq_lens, only,
            case.scale, extend_lens=case.extend_lens, qo_indptr=case.qo_indptr, splits=splits)
        torch.testing.assert_close(only[decode_rows], out[decode_rows], **TOL)
        others = torch.ones(t, dtype=torch.bool)
        others[decode_rows] = False
        assert bool((only[others] == 7.0).all())  # rows of longer extends left alone


def test_attention_extend_of_decodes_only_and_of_padding_only(
        kernels: dict[str, ModuleType]) -> None:
    run = kernels["extend_attention"].attention_extend
    case = make_paged_case((1, 70, 5, 129), (1,) * 4, 8, 2, 32, torch.float32, seed=20)
    args = (case.q, case.k_cache, case.v_cache, case.req_to_token, case.seq_lens,
            case.extend_lens, case.qo_indptr, case.scale)
    torch.testing.assert_close(run(*args), reference_op("attention_extend")(*args), **TOL)
    empty = pad_paged_case(make_paged_case((), (), 8, 2, 32, torch.float32, seed=21),
                           tokens=40, requests=2, seed=22)
    out = run(empty.q, empty.k_cache, empty.v_cache, empty.req_to_token, empty.seq_lens,
              empty.extend_lens, empty.qo_indptr, empty.scale)
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv(kernels: dict[str, ModuleType], with_bias: bool) -> None:
    # 37 output rows and 100 inputs: neither a multiple of the blocks (masking on both axes)
    x, w = _rand(1, 100, seed=15), _rand(37, 100, seed=16)
    bias = _rand(37, seed=17) if with_bias else None
    out = kernels["gemv"].gemv(x, w, bias, 8, 32, 4)
    torch.testing.assert_close(out, reference_op("linear")(x, w, bias), **TOL)


def test_the_decode_grid_switch(kernels: dict[str, ModuleType]) -> None:
    """HAL_CUDA_DECODE_GRID: heads (unset, the default) or batch; anything else is refused."""
    parse = kernels["decode_attention"]._heads_first
    assert parse(None) and parse("heads") and parse(" Heads ")
    assert not parse("batch")
    with pytest.raises(ValueError, match="HAL_CUDA_DECODE_GRID"):
        parse("rows")


def test_the_fp8_decode_tile_switch(kernels: dict[str, ModuleType]) -> None:
    """HAL_CUDA_DECODE_FP8_TILE: BLOCK_N,WARPS,STAGES[,MAXNREG]; anything else is refused
    with the variable's name."""
    parse = kernels["decode_attention"].parse_tile
    assert parse("64,2,3") == (64, 2, 3, None)
    assert parse(" 32, 2, 3, 128 ") == (32, 2, 3, 128)
    for bad in ("", "64,2", "64,2,3,128,1", "48,2,3", "64,3,3", "64,2,0", "64,2,3,8",
                "64,2,3,300", "a,b,c", "8,2,3"):
        with pytest.raises(ValueError, match="HAL_CUDA_DECODE_FP8_TILE"):
            parse(bad)


def test_decode_split_counts(kernels: dict[str, ModuleType]) -> None:
    """Two waves of programs over the chip, and two splits at least below five programs a
    multiprocessor (132 of them, 8 KV heads: up to 82 requests), one from there."""
    splits = kernels["decode_attention"].splits_for
    assert [splits(b, 8, 132) for b in (1, 2, 16, 32, 33, 64, 82, 83, 128, 256)] == \
        [32, 17, 3, 2, 2, 2, 2, 1, 1, 1]
    assert splits(0, 8, 132) == 32 and splits(659, 1, 132) == 2 and splits(660, 1, 132) == 1
