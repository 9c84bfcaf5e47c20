"""AWQ, GPTQ and fp8 checkpoints: quantization_config parsing, the tensors' unpacking (against
packers written after AutoAWQ's and AutoGPTQ's own code) and whole folders against their
dequantized float twins."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tessera.formats import UnsupportedModelError, open_model
from tessera.formats.hf_quant import awq_weight, fp8_weight, gptq_weight
from tessera.formats.layout import is_linear_weight
from tessera.formats.quant_config import parse_quantization_config
from tessera.hal.quant import QuantizedWeight
from tests.formats.quant_checkpoints import awq_pack, fp8_pack, gptq_pack, write_quantized
from tests.worker_proc.helpers import tiny_hf_model


def test_awq_unpacks_to_what_it_packed() -> None:
    packed = awq_pack(24, 64, 32, seed=1)
    w = awq_weight("m", packed.tensors["qweight"], packed.tensors["qzeros"],
                   packed.tensors["scales"], 32)
    assert (w.scheme, w.group_size, w.shape) == ("int4", 32, (24, 64))
    assert torch.equal(w.dequantize(), packed.dequantized)


@pytest.mark.parametrize("v2", [False, True])
@pytest.mark.parametrize("sym", [False, True])
def test_gptq_unpacks_to_what_it_packed(v2: bool, sym: bool) -> None:
    packed = gptq_pack(16, 128, 32, seed=2, v2=v2, sym=sym)
    t = packed.tensors
    w = gptq_weight("m", t["qweight"], t["qzeros"], t["scales"], t["g_idx"], 32,
                    zeros_offset=0 if v2 else 1)
    assert w.input_perm is None
    assert torch.equal(w.dequantize(), packed.dequantized)


def test_gptq_act_order_sorts_rows_and_permutes_the_input() -> None:
    packed = gptq_pack(16, 128, 32, seed=3, desc_act=True)
    t = packed.tensors
    w = gptq_weight("m", t["qweight"], t["qzeros"], t["scales"], t["g_idx"], 32, 1)
    assert w.input_perm is not None
    torch.testing.assert_close(w.dequantize(), packed.dequantized, atol=0, rtol=0)
    bad = t["g_idx"].clone()
    bad[0], bad[1] = 0, 0
    bad[bad == 1] = 0
    with pytest.raises(Exception, match="g_idx does not assign"):
        gptq_weight("m", t["qweight"], t["qzeros"], t["scales"], bad, 32, 1)


@pytest.mark.parametrize("per_tensor", [False, True])
def test_fp8_scales_per_row_or_per_tensor(per_tensor: bool) -> None:
    dense = torch.randn(8, 32)
    packed = fp8_pack(dense, per_tensor)
    w = fp8_weight("m", packed.tensors["weight"], packed.tensors["weight_scale"])
    assert w.scales.shape == (8, 1)
    assert torch.equal(w.dequantize(), packed.dequantized)
    with pytest.raises(Exception, match="block-wise"):
        fp8_weight("m", packed.tensors["weight"], torch.ones(2, 2))


@pytest.mark.parametrize("method,kw", [
    ("awq", {}), ("gptq", {}), ("gptq", {"desc_act": True, "sym": True}),
    ("fp8", {}), ("fp8", {"per_tensor": True}),
], ids=["awq", "gptq", "gptq-act-order-sym", "fp8-channel", "fp8-tensor"])
def test_checkpoint_folder_stands_for_its_float_twin(tmp_path, method: str, kw: dict) -> None:
    folder, twin = str(tmp_path / "q"), str(tmp_path / "twin")
    tiny_hf_model("llama31", folder, rope_scaling=None)
    write_quantized(folder, twin, method, group=32, **kw)
    files, float_files = open_model(folder), open_model(twin)
    assert files.quantization is not None and files.quantization.startswith(method)
    assert files.tensor_names() == float_files.tensor_names()
    want = dict(float_files.iter_tensors(torch.float32, progress=False))
    kept = dict(files.iter_tensors(torch.float32, progress=False, keep_quantized=True))
    dense = dict(files.iter_tensors(torch.float32, progress=False))
    for name, value in kept.items():
        if is_linear_weight(name) and name != "lm_head.weight":
            assert isinstance(value, QuantizedWeight), name
            assert torch.equal(value.dequantize(), want[name]), name
        else:
            assert torch.equal(value, want[name]), name
        assert torch.equal(dense[name], want[name]), name


def _config(q: dict) -> dict:
    return {"quantization_config": q}


@pytest.mark.parametrize("q,message", [
    ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "packing version 'gemv'"),
    ({"quant_method": "gptq", "bits": 8}, "GPTQ with 8 bits"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "format 'marlin'"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"g": {}}}, "format 'pack-quantized'"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {
        "g": {"weights": {"num_bits": 8, "type": "float", "strategy": "block"}}}},
     "strategy 'block'"),
    ({"quant_method": "bitsandbytes"}, "method 'bitsandbytes'"),
])
def test_unsupported_quantization_is_refused_by_name(q: dict, message: str) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        parse_quantization_config(_config(q))


def test_supported_configs_map_to_schemes(tmp_path) -> None:
    assert parse_quantization_config({}) is None
    awq = parse_quantization_config(_config({"quant_method": "awq", "bits": 4,
                                             "group_size": 64}))
    assert awq is not None and (awq.scheme, awq.group_size) == ("int4", 64)
    gptq = parse_quantization_config(_config({"quant_method": "gptq", "bits": 4,
                                              "group_size": -1, "desc_act": True}))
    assert gptq is not None and (gptq.group_size, gptq.desc_act, gptq.zeros_offset) == \
        (-1, True, 1)
    fb = parse_quantization_config(_config({"quant_method": "fbgemm_fp8"}))
    assert fb is not None and fb.scheme == "fp8"
    # modelopt writes hf_quant_config.json beside config.json
    with open(os.path.join(tmp_path, "hf_quant_config.json"), "w") as f:
        json.dump({"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
                                    "exclude_modules": ["lm_head"]}}, f)
    mo = parse_quantization_config({}, str(tmp_path))
    assert mo is not None and (mo.scheme, mo.kv_cache_fp8, mo.ignored) == \
        ("fp8", True, ("lm_head",))
