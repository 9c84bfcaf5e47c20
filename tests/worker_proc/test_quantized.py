"""Quantized models on the cpu plugin: AWQ / GPTQ / fp8 checkpoints written by the tests serve
exactly like their dequantized float twins, --quantization quantizes at load, fused layers
with mixed schemes, and the fp8 KV cache."""

from __future__ import annotations

import math
import os

import pytest
import torch

from tessera.hal.quant import QuantizedWeight, quantize
from tessera.worker_proc.models.layers.quant_linear import QuantLinear
from tests.formats.quant_checkpoints import write_quantized
from tests.worker_proc.driver import MiniScheduler
from tests.worker_proc.helpers import make_runner, prompts, tiny_hf_model

LENGTHS = [2, 5, 11, 17]
NEW = 12


def _linears(runner) -> list:
    from tessera.worker_proc.models.layers.linear import Linear

    return [m for m in runner.model.modules() if isinstance(m, Linear)]


@pytest.mark.parametrize("kind,method,kw", [
    ("llama31", "awq", {}),
    ("llama31", "gptq", {}),
    ("qwen2", "gptq", {"desc_act": True, "sym": True, "v2": True}),
    ("llama31", "fp8", {}),
    ("qwen2", "fp8", {"per_tensor": True}),
], ids=["llama-awq", "llama-gptq", "qwen2-gptq-act-order", "llama-fp8", "qwen2-fp8-tensor"])
def test_checkpoint_serves_like_its_float_twin(tmp_path, kind: str, method: str, kw: dict):
    folder, twin = str(tmp_path / "q"), str(tmp_path / "twin")
    tiny_hf_model(kind, folder, rope_scaling=None)
    write_quantized(folder, twin, method, group=32, **kw)
    quantized, dense = make_runner(folder), make_runner(twin)
    # every projection (qkv, o, gate_up, down of 2 layers) kept quantized; the head stays as
    # the checkpoint has it, in floating point
    projections = [m for m in _linears(quantized) if m.role == "linear"]
    assert len(projections) == 8
    assert all(isinstance(s.weight, QuantizedWeight) for m in projections
               for s in m.method.segments)
    heads = [m for m in _linears(quantized) if m.role != "linear"]
    assert all(not isinstance(m.method, QuantLinear) or all(
        isinstance(s.weight, torch.Tensor) for s in m.method.segments) for m in heads)
    assert quantized.weight_bytes < dense.weight_bytes
    batch = prompts(256, LENGTHS, seed=3)
    q_logits = MiniScheduler(quantized).prefill_logits(batch)
    d_logits = MiniScheduler(dense).prefill_logits(batch)
    torch.testing.assert_close(q_logits, d_logits, atol=1e-4, rtol=1e-4)
    got = [r.out for r in MiniScheduler(quantized).generate(batch, NEW)]
    assert got == [r.out for r in MiniScheduler(dense).generate(batch, NEW)]


def _twin_of_quantized(src: str, dst: str, scheme: str) -> None:
    """A float checkpoint holding quantize(w, scheme).dequantize() for each projection: what
    --quantization scheme must compute on the source."""
    from safetensors.torch import load_file, save_file

    state = load_file(os.path.join(src, "model.safetensors"))
    for name, tensor in state.items():
        if name.endswith("_proj.weight"):
            state[name] = quantize(tensor, scheme).dequantize(tensor.dtype)
    os.makedirs(dst)
    for other in os.listdir(src):
        if other != "model.safetensors":
            with open(os.path.join(src, other), "rb") as f, \
                    open(os.path.join(dst, other), "wb") as g:
                g.write(f.read())
    save_file(state, os.path.join(dst, "model.safetensors"))


@pytest.mark.parametrize("scheme", ["fp8", "int8", "int4"])
def test_quantization_flag_quantizes_at_load(tmp_path, scheme: str):
    folder, twin = str(tmp_path / "f"), str(tmp_path / "twin")
    tiny_hf_model("llama31", folder, rope_scaling=None)
    _twin_of_quantized(folder, twin, scheme)
    runner = make_runner(folder, quantization=scheme)
    assert runner.quant.quantize_to == scheme
    heads = [m for m in _linears(runner) if m.role != "linear"]
    assert heads and all(not isinstance(m.method, QuantLinear) or all(
        isinstance(s.weight, torch.Tensor) for s in m.method.segments) for m in heads)
    batch = prompts(256, LENGTHS, seed=4)
    torch.testing.assert_close(MiniScheduler(runner).prefill_logits(batch),
                               MiniScheduler(make_runner(twin)).prefill_logits(batch),
                               atol=1e-4, rtol=1e-4)


def _twin_with_quantized_head(src: str, dst: str, scheme: str) -> None:
    """_twin_of_quantized with the LM head quantized as well, in the groups QuantLinear uses:
    what --quantization scheme --quantize-lm-head must compute. A tied source becomes an untied
    twin: its head the quantized table, its embedding the table itself."""
    import json

    from safetensors.torch import load_file, save_file

    from tessera.hal.quant.quantize import group_size_for

    _twin_of_quantized(src, dst, scheme)
    path = os.path.join(dst, "model.safetensors")
    state = load_file(path)
    with open(os.path.join(dst, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    head = state.get("lm_head.weight")
    if config.get("tie_word_embeddings") or head is None:
        head = state["model.embed_tokens.weight"]
        config["tie_word_embeddings"] = False
        with open(os.path.join(dst, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f)
    state["lm_head.weight"] = quantize(head, scheme, group_size_for(head.shape[1])) \
        .dequantize(head.dtype).contiguous()
    save_file(state, path)


@pytest.mark.parametrize("kind,scheme", [("llama31", "fp8"), ("llama31", "int4"),
                                         ("qwen2", "int8")],
                         ids=["untied-fp8", "untied-int4", "tied-int8"])
def test_quantize_lm_head_quantizes_the_head_at_load(tmp_path, kind: str, scheme: str):
    """--quantize-lm-head: the head's weight is held quantized (a tied head as a quantized copy
    of the table, the lookup still the float table) and the model computes what a float twin
    holding the quantized values computes; without the flag the head stays float."""
    folder, twin = str(tmp_path / "f"), str(tmp_path / "twin")
    tiny_hf_model(kind, folder, rope_scaling=None)
    _twin_with_quantized_head(folder, twin, scheme)
    runner = make_runner(folder, quantization=scheme, quantize_lm_head=True)
    assert runner.quant.lm_head == scheme
    heads = [m for m in _linears(runner) if m.role != "linear"]
    assert [m.role for m in heads] == ["lm_head"]
    assert isinstance(heads[0].method, QuantLinear)
    assert all(isinstance(s.weight, QuantizedWeight) and s.weight.scheme == scheme
               for s in heads[0].method.segments)
    assert runner.model.embed.weight.dtype == torch.float32  # the lookup's table, unquantized
    plain = make_runner(folder, quantization=scheme)
    assert runner.weight_bytes != plain.weight_bytes
    batch = prompts(256, LENGTHS, seed=8)
    dense_twin = make_runner(twin)
    torch.testing.assert_close(MiniScheduler(runner).prefill_logits(batch),
                               MiniScheduler(dense_twin).prefill_logits(batch),
                               atol=1e-4, rtol=1e-4)
    got = [r.out for r in MiniScheduler(runner).generate(batch, NEW)]
    assert got == [r.out for r in MiniScheduler(dense_twin).generate(batch, NEW)]
    # the head's quantization changes the logits: the comparison above is not vacuous
    assert not torch.allclose(MiniScheduler(plain).prefill_logits(batch),
                              MiniScheduler(dense_twin).prefill_logits(batch), atol=1e-4)


def test_quantize_lm_head_needs_a_scheme_quantized_at_load(tmp_path):
    from tessera.config import EngineConfig
    from tessera.formats import open_model
    from tessera.hal.registry import load_platform
    from tessera.worker_proc.quant_plan import plan_quantization

    for requested in ("auto", "none"):
        with pytest.raises(ValueError, match="--quantize-lm-head.*fp8, int8 or int4"):
            EngineConfig(model="m", quantization=requested, quantize_lm_head=True)
    folder = str(tmp_path / "f")
    tiny_hf_model("llama31", folder, rope_scaling=None)
    with pytest.raises(ValueError, match="--quantize-lm-head"):
        plan_quantization("auto", open_model(folder), load_platform("cpu"), lm_head=True)


def test_requantizing_a_gguf_and_dummy_weights(tmp_path):
    """A quantized checkpoint asked for another scheme is dequantized, then requantized; dummy
    weights quantize at load like any float checkpoint."""
    from tests.formats.gguf_helpers import write_gguf

    model = tiny_hf_model("llama31", str(tmp_path / "src"), rope_scaling=None)
    path = str(tmp_path / "m.gguf")
    write_gguf(path, "llama", model.config, model.state_dict(), quant="Q4_0")
    kept = make_runner(path)
    assert kept.quant.keep_checkpoint and kept.quant.quantize_to is None
    fp8 = make_runner(path, quantization="fp8")
    assert not fp8.quant.keep_checkpoint and fp8.quant.quantize_to == "fp8"
    schemes = {s.weight.scheme for m in _linears(fp8) if isinstance(m.method, QuantLinear)
               for s in m.method.segments if isinstance(s.weight, QuantizedWeight)}
    assert schemes == {"fp8"}
    dummy = make_runner(str(tmp_path / "src"), load_format="dummy", quantization="int4")
    out = MiniScheduler(dummy).generate(prompts(256, [4], seed=5), 3)
    assert len(out[0].out) == 3


def test_fused_parts_in_different_schemes_run_as_segments():
    """q and k in int4, v in int8 (as GGUF Q4_K_M stores some layers): one layer, two
    segments, the product of the whole matrix."""
    from tessera.formats.config import ModelConfig
    from tessera.hal.registry import load_platform
    from tessera.worker_proc.models.context import ModelContext
    from tessera.worker_proc.models.layers.linear import Linear, OutputPart
    from tessera.worker_proc.quant_plan import QuantPlan
    from tessera.worker_proc.tp import TPShape

    cfg = ModelConfig(arch="llama", hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2,
                      head_dim=16, intermediate_size=128, vocab_size=32, rms_norm_eps=1e-5,
                      rope_theta=1e4, max_position_embeddings=64, tie_word_embeddings=True,
                      qkv_bias=True, qk_norm=False)
    platform = load_platform("cpu")
    ctx = ModelContext(cfg, platform, TPShape.of(cfg, 0, 1), torch.float32,
                       torch.device("cpu"), 64, quant=QuantPlan(True, None, platform))
    parts = [OutputPart("q", 0, 0, 64), OutputPart("k", 64, 0, 32), OutputPart("v", 96, 0, 32)]
    layer = Linear.column(ctx, 64, parts, bias=True)
    gen = torch.Generator().manual_seed(6)
    dense = {p: torch.randn((n, 64), generator=gen) / math.sqrt(64)
             for p, n in (("q", 64), ("k", 32), ("v", 32))}
    weights = {"q": quantize(dense["q"], "int4", 32), "k": quantize(dense["k"], "int4", 32),
               "v": quantize(dense["v"], "int8", 16)}
    bias = torch.randn(128, generator=gen)
    for part, w in weights.items():
        layer.load("weight", w, part)
    layer.load("bias", bias[:64], "q")
    layer.load("bias", bias[64:96], "k")
    layer.load("bias", bias[96:], "v")
    layer.finish_loading()
    assert [s.size for s in layer.method.segments] == [96, 32]
    x = torch.randn((5, 64), generator=gen)
    full = torch.cat([weights[p].dequantize() for p in ("q", "k", "v")])
    torch.testing.assert_close(layer(x), x @ full.t() + bias, atol=1e-5, rtol=1e-5)


def test_unsupported_scheme_fails_at_start_with_advice(tmp_path, monkeypatch):
    from tessera.hal.errors import MissingSchemeError
    from tessera.hal.registry import load_platform
    from tessera.worker_proc.quant_plan import plan_quantization

    folder = str(tmp_path / "f")
    tiny_hf_model("llama31", folder, rope_scaling=None)
    write_quantized(folder, str(tmp_path / "twin"), "awq", group=32)
    from tessera.formats import open_model

    platform = load_platform("cpu")
    monkeypatch.setattr(platform, "_quant", {})
    with pytest.raises(MissingSchemeError, match="--quantization none"):
        plan_quantization("auto", open_model(folder), platform)
    assert not plan_quantization("none", open_model(folder), platform).active


def test_fp8_kv_cache_halves_the_bytes_and_stays_close(tmp_path):
    folder = str(tmp_path / "f")
    tiny_hf_model("llama31", folder, rope_scaling=None)
    base = make_runner(folder)
    fp8 = make_runner(folder, kv_cache_dtype="fp8_e4m3")
    assert fp8.kv.storage.dtype == torch.float8_e4m3fn
    assert fp8.kv_plan.bytes_per_slot * 4 == base.kv_plan.bytes_per_slot  # fp32 -> fp8
    batch = prompts(256, LENGTHS, seed=7)
    ref = MiniScheduler(base).prefill_logits(batch)
    got = MiniScheduler(fp8).prefill_logits(batch)
    kl = torch.nn.functional.kl_div(got.log_softmax(-1), ref.log_softmax(-1),
                                    log_target=True, reduction="batchmean")
    assert float(kl) < 1e-3, float(kl)
    # decode reads the fp8 cache too
    out = MiniScheduler(fp8).generate(batch, 4)
    assert all(len(r.out) == 4 for r in out)


def test_fp8_kv_cache_scales_come_from_the_checkpoint(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = str(tmp_path / "f")
    tiny_hf_model("llama31", folder, rope_scaling=None)
    path = os.path.join(folder, "model.safetensors")
    state = load_file(path)
    state["model.layers.1.self_attn.k_scale"] = torch.tensor(0.5)
    state["model.layers.1.self_attn.v_proj.v_scale"] = torch.tensor(0.25)  # modelopt's name
    save_file(state, path)
    runner = make_runner(folder, kv_cache_dtype="fp8_e4m3")
    from tessera.worker_proc.models.layers.attention import Attention

    scales = [m.kv_scales for m in runner.model.modules() if isinstance(m, Attention)]
    assert scales == [(1.0, 1.0), (0.5, 0.25)]
    assert make_runner(folder).model.layers[1].attn.kv_scales is None  # not an fp8 cache


@pytest.mark.integration
@pytest.mark.parametrize("kind,method,quantization", [
    ("llama31", "gptq", "auto"), ("llama31", "float", "fp8"), ("llama31", "float", "int4"),
    ("qwen2", "fp8", "auto")])
def test_two_ranks_serve_quantized_like_one(tmp_path, kind: str, method: str,
                                            quantization: str):
    """Column-parallel rows and row-parallel groups of a quantized weight, on two gloo ranks:
    the logits and greedy tokens of one rank serving the same weights. The qwen2 case: fp8
    with one scale per tensor, each rank fusing its share of q/k/v (their own scales) and of
    the q/k/v biases."""
    import json
    import subprocess
    import sys

    folder = str(tmp_path / "m")
    # wide enough that int4's groups of 128 hold whole on each rank's half of o and down
    overrides = {"rope_scaling": None} if kind == "llama31" else {}
    tiny_hf_model(kind, folder, hidden_size=256, intermediate_size=512, **overrides)
    if method == "gptq":
        write_quantized(folder, str(tmp_path / "twin"), "gptq", group=32)
    elif method == "fp8":
        write_quantized(folder, str(tmp_path / "twin"), "fp8", per_tensor=True)
    batch = prompts(256, [5, 17, 30], seed=8)
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [subprocess.Popen([sys.executable, "-m", "tests.worker_proc.tp_rank", folder,
                               str(rank), "2", init, str(tmp_path / f"rank{rank}.json"),
                               json.dumps(batch), "1", quantization])
             for rank in range(2)]
    for p in procs:
        assert p.wait(timeout=300) == 0
    out = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    one = make_runner(folder, quantization=quantization)
    torch.testing.assert_close(torch.tensor(out[0]["logits"]),
                               MiniScheduler(one).prefill_logits(batch), atol=1e-4, rtol=1e-4)
    assert out[0]["greedy"] == [r.out for r in MiniScheduler(one).generate(batch, 12)]
    assert out[1]["greedy"] == out[0]["greedy"]


def _fusing(runner) -> int:
    """Has every quantized segment's kernel claim the one-token fusion (the cpu plugin runs
    it as its composition and leaves `fuses` False); returns how many segments it patched."""
    import dataclasses

    patched = 0
    for m in _linears(runner):
        if isinstance(m.method, QuantLinear):
            for seg in m.method.segments:
                if seg.kernel is not None:
                    seg.kernel = dataclasses.replace(
                        seg.kernel, fuses=lambda w: w.input_perm is None)
                    patched += 1
    return patched


@pytest.mark.parametrize("kind,method,kw", [
    ("llama31", "awq", {}),
    ("qwen2", "fp8", {}),  # a qkv bias, added before the rounding
], ids=["llama-awq", "qwen2-fp8"])
def test_one_token_fusion_keeps_the_tokens(tmp_path, monkeypatch, kind: str, method: str,
                                           kw: dict):
    """A one-token step over fused products (norms as prologues, residual adds and the SiLU
    as epilogues: LlamaDecoderLayer.forward_one_token) gives the plain path's greedy tokens,
    and runs only where every projection fuses and the step has one token."""
    from tessera.worker_proc.models.llama import LlamaDecoderLayer

    folder, twin = str(tmp_path / "q"), str(tmp_path / "twin")
    tiny_hf_model(kind, folder, rope_scaling=None)
    write_quantized(folder, twin, method, group=32, **kw)
    plain, fused = make_runner(folder), make_runner(folder)
    assert not plain.model.fuses_one_token()  # the cpu plugin's kernels do not claim it
    assert _fusing(fused) == 8
    assert fused.model.fuses_one_token()
    calls: list[int] = []
    real = LlamaDecoderLayer.forward_one_token

    def counted(self, x, inp, kv):
        calls.append(x.shape[0])
        return real(self, x, inp, kv)

    monkeypatch.setattr(LlamaDecoderLayer, "forward_one_token", counted)
    for seed, length in ((6, 5), (7, 13)):
        one = prompts(256, [length], seed=seed)
        got = MiniScheduler(fused).generate(one, NEW)[0].out
        assert got == MiniScheduler(plain).generate(one, NEW)[0].out
    # the decode steps (NEW - 1 a prompt) of both layers, one token each; prefills of
    # several tokens took the plain path
    assert calls == [1] * (2 * 2 * (NEW - 1))
    calls.clear()
    batch = prompts(256, LENGTHS, seed=8)
    assert [r.out for r in MiniScheduler(fused).generate(batch, 4)] == \
        [r.out for r in MiniScheduler(plain).generate(batch, 4)]
    assert calls == []  # four requests a step: never one token


def test_one_token_fusion_needs_every_projection(tmp_path):
    """An act-order GPTQ weight (its input permuted) is not fused: the model keeps its plain
    path rather than fusing some layers and composing the rest."""
    folder, twin = str(tmp_path / "q"), str(tmp_path / "twin")
    tiny_hf_model("qwen2", folder, rope_scaling=None)
    write_quantized(folder, twin, "gptq", group=32, desc_act=True, sym=True, v2=True)
    runner = make_runner(folder)
    _fusing(runner)
    assert not runner.model.fuses_one_token()


def _rows_fusing(runner) -> list[tuple[int, str]]:
    """Gives every quantized segment's kernel a rows_fused (the cpu plugin has none): the
    definition's composition over the kernel's own product, each call logged as (tokens,
    the fusion); returns the log."""
    import dataclasses

    from tessera.hal.quant import rows_fused_reference

    log: list[tuple[int, str]] = []

    def with_log(kernel):  # noqa: ANN001, ANN202 - a test double
        def rows_fused(x, w, bias, *, norm=None, residual=None, silu=False):  # noqa: ANN001
            log.append((x.shape[0], "silu" if silu else
                        "norm+residual" if residual is not None else "norm"))
            return rows_fused_reference(x, w, bias, norm=norm, residual=residual, silu=silu,
                                        linear=kernel.apply)
        return rows_fused

    for m in _linears(runner):
        if isinstance(m.method, QuantLinear):
            for seg in m.method.segments:
                if seg.kernel is not None:
                    seg.kernel = dataclasses.replace(seg.kernel,
                                                     rows_fused=with_log(seg.kernel))
    return log


def test_rows_fusion_keeps_the_tokens(tmp_path):
    """Steps over products that take the norm or the SiLU before them
    (LlamaDecoderLayer.forward_rows_fused: Linear.rows_fused of qkv, gate/up and down) give
    the plain path's greedy tokens, prefills and decodes; the first layer's norm takes no
    residual, every later one the stream's; a model whose qkv cannot fuse keeps the plain
    path."""
    folder, twin = str(tmp_path / "q"), str(tmp_path / "twin")
    tiny_hf_model("llama31", folder, rope_scaling=None)
    write_quantized(folder, twin, "fp8")
    plain, fused = make_runner(folder), make_runner(folder)
    assert not any(layer.fuses_rows() for layer in plain.model.layers)
    log = _rows_fusing(fused)
    assert all(layer.fuses_rows() for layer in fused.model.layers)
    batch = prompts(256, LENGTHS, seed=9)
    assert [r.out for r in MiniScheduler(fused).generate(batch, NEW)] == \
        [r.out for r in MiniScheduler(plain).generate(batch, NEW)]
    layers = len(fused.model.layers)
    first_step = log[:3 * layers]
    assert [f for _, f in first_step] == ["norm", "norm+residual", "silu"] + \
        ["norm+residual", "norm+residual", "silu"] * (layers - 1)
    assert {t for t, _ in first_step} == {sum(LENGTHS)}  # the prefill step's tokens
    assert len(log) % (3 * layers) == 0 and len(log) > 3 * layers  # decode steps too
    import dataclasses

    other = make_runner(folder)
    _rows_fusing(other)
    seg = other.model.layers[0].attn.qkv.method.segments[0]
    seg.kernel = dataclasses.replace(seg.kernel, rows_fused=None)
    assert not other.model.layers[0].fuses_rows() and other.model.layers[1].fuses_rows()
