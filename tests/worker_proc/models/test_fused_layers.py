"""Fused projections and fused residual adds, in every model family and weight format: each
attention runs q/k/v as one product and each gated MLP gate/up as one (one `linear` op or one
quantized kernel call per layer call), and every residual add of a decoder layer goes through
the HAL `fused_add_rms_norm` op. Rotary runs inside the KV store where the plugin fuses them. Greedy parity of the same models is test_parity_tiny's and
test_quantized's; this pins the number of products, which parity alone would not notice."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tessera.worker_proc.models.layers.attention import Attention
from tessera.worker_proc.models.layers.linear import Linear
from tessera.worker_proc.models.layers.mlp import GatedMLP
from tessera.worker_proc.models.layers.moe import FusedMoE
from tessera.worker_proc.models.layers.norm import RMSNorm
from tessera.worker_proc.models.layers.quant_linear import QuantLinear
from tests.formats.quant_checkpoints import write_quantized
from tests.worker_proc.driver import MiniScheduler
from tests.worker_proc.helpers import make_runner, prompts, tiny_hf_model

FAMILIES = ["llama31", "qwen2", "qwen3", "mistral", "mixtral", "qwen2_moe", "qwen3_moe", "dots1",
            "gemma2", "gemma3", "phi3", "granite"]


def _counted(fn: Callable[..., Any], counts: Counter, key: object) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        counts[key] += 1
        return fn(*args, **kwargs)
    return wrapper


def _instrument(model: torch.nn.Module) -> tuple[Counter, Counter, Counter]:
    """(products per Linear, forwards per Linear, fused add+norm calls per RMSNorm)."""
    products: Counter = Counter()
    forwards: Counter = Counter()
    adds: Counter = Counter()
    for module in model.modules():
        if isinstance(module, Linear):
            module.register_forward_pre_hook(
                lambda m, _args: forwards.update([id(m)]))  # type: ignore[misc]
            if isinstance(module.method, QuantLinear):
                for seg in module.method.segments:
                    seg.run = _counted(seg.run, products, id(module))
            else:
                module.linear_op = _counted(module.linear_op, products, id(module))
        elif isinstance(module, RMSNorm):
            module.add_norm_op = _counted(module.add_norm_op, adds, id(module))
    return products, forwards, adds


def _check_fused(runner: Any, batch: list[list[int]]) -> None:
    model = runner.model
    attentions = [m for m in model.modules() if isinstance(m, Attention)]
    mlps = [m for m in model.modules() if isinstance(m, GatedMLP)]
    experts = [m for m in model.modules() if isinstance(m, FusedMoE)]
    assert len(attentions) == model.config.num_layers and (mlps or experts)
    for moe in experts:  # gate and up of every expert stacked in one tensor, as for an MLP
        assert moe.w13.shape[:2] == (moe.num_local, 2 * moe.inter)
    for attn in attentions:
        linears = {name: m for name, m in attn.named_children() if isinstance(m, Linear)}
        assert set(linears) == {"qkv", "o"}
        assert list(attn.qkv.parts) == ["q", "k", "v"]
    for mlp in mlps:
        linears = {name: m for name, m in mlp.named_children() if isinstance(m, Linear)}
        assert set(linears) == {"gate_up", "down"}
        assert list(mlp.gate_up.parts) == ["gate", "up"]
    products, forwards, adds = _instrument(model)
    generated = MiniScheduler(runner).generate(batch, 3)
    assert all(len(r.out) == 3 for r in generated)
    for owner in [*attentions, *mlps]:
        layer = owner.qkv if isinstance(owner, Attention) else owner.gate_up
        assert forwards[id(layer)] > 0
        assert products[id(layer)] == forwards[id(layer)], "a fused layer ran several products"
    # Every other linear issues one product per call too (no hidden split).
    assert products == forwards
    # Two residual adds per decoder layer (after attention, after the MLP; the last one is
    # the final norm's), each through fused_add_rms_norm: 2 L calls per forward.
    steps = forwards[id(attentions[0].qkv)]
    assert sum(adds.values()) == 2 * model.config.num_layers * steps


@pytest.mark.parametrize("kind", FAMILIES)
def test_every_family_runs_fused_projections_and_adds(tmp_path, kind: str):
    folder = str(tmp_path / kind)
    model = tiny_hf_model(kind, folder)
    _check_fused(make_runner(folder), prompts(model.config.vocab_size, [3, 9], seed=2))


@pytest.mark.parametrize("method,kw", [
    ("awq", {}), ("gptq", {}),
    ("gptq", {"desc_act": True, "sym": True, "v2": True, "shared_order": True}),
    ("fp8", {}), ("fp8", {"per_tensor": True}),
], ids=["awq", "gptq", "gptq-act-order", "fp8-channel", "fp8-tensor"])
def test_quantized_checkpoints_fuse_into_one_kernel_call(tmp_path, method: str, kw: dict):
    """qwen2: the q/k/v biases are fused beside the quantized rows. Per-tensor fp8 scales
    become one scale per output row at load, so q, k and v keep their own and still fuse.
    GPTQ act-order parts fuse when they share their input order, as GPTQ writes them."""
    folder, twin = str(tmp_path / "q"), str(tmp_path / "twin")
    tiny_hf_model("qwen2", folder)
    write_quantized(folder, twin, method, group=32, **kw)
    runner = make_runner(folder)
    for attn in (m for m in runner.model.modules() if isinstance(m, Attention)):
        assert len(attn.qkv.method.segments) == 1
    batch = prompts(256, [3, 9], seed=2)
    # the fused product computes what the checkpoint means: its dequantized float twin
    torch.testing.assert_close(MiniScheduler(runner).prefill_logits(batch),
                               MiniScheduler(make_runner(twin)).prefill_logits(batch),
                               atol=1e-4, rtol=1e-4)
    _check_fused(runner, batch)


def test_act_order_parts_of_different_orders_run_as_segments(tmp_path):
    """Parts whose input orders differ cannot share one matrix: each stays its own product
    (exact; the layer then runs one product per part and concatenates)."""
    folder, twin = str(tmp_path / "q"), str(tmp_path / "twin")
    tiny_hf_model("qwen2", folder)
    write_quantized(folder, twin, "gptq", group=32, desc_act=True, sym=True, v2=True)
    runner = make_runner(folder)
    for attn in (m for m in runner.model.modules() if isinstance(m, Attention)):
        assert [s.size for s in attn.qkv.method.segments] == [64, 32, 32]


@pytest.mark.parametrize("scheme", ["fp8", "int8", "int4"])
def test_quantizing_at_load_fuses_into_one_kernel_call(tmp_path, scheme: str):
    folder = str(tmp_path / "f")
    tiny_hf_model("qwen2", folder)
    runner = make_runner(folder, quantization=scheme)
    _check_fused(runner, prompts(256, [3, 9], seed=2))


def test_gguf_projections_of_one_type_fuse(tmp_path):
    from tests.formats.gguf_helpers import write_gguf

    model = tiny_hf_model("llama31", str(tmp_path / "src"), rope_scaling=None)
    path = str(tmp_path / "m.gguf")
    write_gguf(path, "llama", model.config, model.state_dict(), quant="Q4_0")
    runner = make_runner(path)
    assert all(len(m.method.segments) == 1 for m in runner.model.modules()
               if isinstance(m, Linear) and isinstance(m.method, QuantLinear))
    _check_fused(runner, prompts(256, [3, 9], seed=2))


def test_dummy_weights_fuse_as_a_checkpoint_does(tmp_path):
    """The benchmarks' --load-format dummy streams its tensors through the same targets."""
    folder = str(tmp_path / "m")
    tiny_hf_model("llama31", folder)
    _check_fused(make_runner(folder, load_format="dummy"), prompts(256, [3, 9], seed=2))


def _count_rotary_ops(runner: Any) -> Counter:
    """Calls of the fused and the unfused rotary/KV-store ops in the runner's attentions."""
    calls: Counter = Counter()
    for attn in (m for m in runner.model.modules() if isinstance(m, Attention)):
        if attn.rotary_store_kv is not None:
            attn.rotary_store_kv = _counted(attn.rotary_store_kv, calls, "rotary_store_kv")
        attn.store_kv = _counted(attn.store_kv, calls, "store_kv")
        if not isinstance(attn.rotary.rotary_op, _Counting):
            attn.rotary.rotary_op = _Counting(attn.rotary.rotary_op, calls)
    return calls


class _Counting:
    """A rotary table shared by layers is wrapped once."""

    def __init__(self, fn: Callable[..., Any], calls: Counter) -> None:
        self.fn, self.calls = fn, calls

    def __call__(self, *args: Any) -> Any:
        self.calls["rotary_embedding"] += 1
        return self.fn(*args)


def _cpu_without_fusions() -> Any:
    """A cpu platform that fuses nothing: the worker composes rotary and store_kv."""
    from tessera.hal.cpu import CpuPlatform

    class NoFusion(CpuPlatform):
        def fused_op(self, name: str) -> None:
            return None

    return NoFusion()


@pytest.mark.parametrize("kind", ["llama31", "qwen3", "gemma2", "phi3"])
def test_rotary_is_applied_inside_the_kv_store_where_the_plugin_fuses_it(tmp_path, kind: str):
    """One rotary_store_kv call per attention forward (q/k norm, sliding windows and per-layer
    rope bases included); partial rotary (phi3) and a plugin without the fusion compose
    rotary_embedding and store_kv; the tokens are the same either way."""
    from tessera.worker_proc.model_runner import ModelRunner

    folder = str(tmp_path / kind)
    model = tiny_hf_model(kind, folder)
    batch = prompts(model.config.vocab_size, [3, 9], seed=4)
    fused = make_runner(folder)
    calls = _count_rotary_ops(fused)
    layers = model.config.num_hidden_layers
    fused_out = [r.out for r in MiniScheduler(fused).generate(batch, 4)]
    partial = kind == "phi3"
    steps = calls["store_kv" if partial else "rotary_store_kv"] // layers
    assert steps >= 4  # a prefill step and decode steps
    if partial:
        assert calls == Counter(store_kv=steps * layers, rotary_embedding=steps * layers)
    else:
        assert calls == Counter(rotary_store_kv=steps * layers)

    plain = ModelRunner(fused.config, 0, _cpu_without_fusions())
    plain_calls = _count_rotary_ops(plain)
    assert [r.out for r in MiniScheduler(plain).generate(batch, 4)] == fused_out
    assert plain_calls == Counter(store_kv=steps * layers, rotary_embedding=steps * layers)


@pytest.mark.parametrize("kind,fused", [("llama31", True), ("qwen2_moe", True),
                                        ("gemma2", False)])
def test_silu_runs_as_the_down_projections_prologue_where_the_plugin_fuses_it(
        tmp_path, kind: str, fused: bool):
    """Every gated MLP with SiLU (a MoE's shared expert included) runs silu_and_mul_linear
    once a call instead of silu_and_mul and the down product; GELU (gemma2) keeps the two
    ops; a plugin without the fusion composes them; the tokens are the same."""
    from tessera.worker_proc.model_runner import ModelRunner

    folder = str(tmp_path / kind)
    model = tiny_hf_model(kind, folder)
    batch = prompts(model.config.vocab_size, [3, 9], seed=6)

    def run(runner: Any) -> tuple[list[list[int]], Counter]:
        calls: Counter = Counter()
        mlps = [m for m in runner.model.modules() if isinstance(m, GatedMLP)]
        assert mlps
        for mlp in mlps:
            mlp.register_forward_pre_hook(lambda m, _a: calls.update(["mlp"]))
            if mlp.act_down is not None:
                mlp.act_down = _counted(mlp.act_down, calls, "silu_and_mul_linear")
            mlp.act_op = _counted(mlp.act_op, calls, "act")
            mlp.down.register_forward_pre_hook(lambda m, _a: calls.update(["down"]))
        return [r.out for r in MiniScheduler(runner).generate(batch, 4)], calls

    tokens, calls = run(make_runner(folder))
    mlp_calls = calls["mlp"]
    assert mlp_calls > 0
    if fused:
        assert calls == Counter(mlp=mlp_calls, silu_and_mul_linear=mlp_calls)
    else:
        assert calls == Counter(mlp=mlp_calls, act=mlp_calls, down=mlp_calls)
    plain_tokens, plain = run(ModelRunner(make_runner(folder).config, 0,
                                          _cpu_without_fusions()))
    assert plain_tokens == tokens
    assert plain == Counter(mlp=mlp_calls, act=mlp_calls, down=mlp_calls)
