"""GGUF block formats -> runtime schemes: the values every weight stands for are exactly what
gguf's own dequantize (llama.cpp's reference, ported to numpy) gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tessera.formats.gguf_quant import BLOCKS, from_gguf_blocks

# byte offsets of the float16 fields of each block (random bytes there could be inf/NaN)
_F16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q4_K": (0, 2), "Q6_K": (208,)}
_SCHEME = {"Q8_0": ("int8", 32), "Q4_0": ("int4", 32), "Q4_1": ("int4", 32),
           "Q4_K": ("int4", 32), "Q6_K": ("int8", 16)}


def random_blocks(kind: str, rows: int, in_features: int, seed: int) -> np.ndarray:
    """Every byte random (every nibble, 6-bit scale and high bit pair is exercised), except
    the float16 fields, which get finite values of either sign."""
    per_block, nbytes = BLOCKS[kind]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows, in_features // per_block, nbytes), dtype=np.uint8)
    for offset in _F16_FIELDS[kind]:
        value = (rng.standard_normal(blocks.shape[:2]) * 0.01).astype(np.float16)
        blocks[..., offset:offset + 2] = value[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_conversion_is_exact(kind: str) -> None:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    in_features = 512
    data = random_blocks(kind, 7, in_features, seed=1)
    weight = from_gguf_blocks(kind, data, in_features)
    assert weight is not None
    assert (weight.scheme, weight.group_size) == _SCHEME[kind]
    expected = dequantize(data, getattr(GGMLQuantizationType, kind)).reshape(7, in_features)
    torch.testing.assert_close(weight.dequantize(), torch.from_numpy(expected.astype(np.float32)),
                               atol=0, rtol=0)


def test_quantized_by_gguf_and_converted() -> None:
    """Blocks written by gguf's quantizer (as llama.cpp writes them) round-trip too."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    w = np.random.default_rng(2).standard_normal((6, 256)).astype(np.float32)
    for kind in ("Q8_0", "Q4_0", "Q4_1"):
        qtype = getattr(GGMLQuantizationType, kind)
        data = quantize(w, qtype)
        weight = from_gguf_blocks(kind, data, 256)
        assert weight is not None
        assert torch.equal(weight.dequantize(), torch.from_numpy(dequantize(data, qtype)))


def test_other_types_are_left_to_the_caller() -> None:
    assert from_gguf_blocks("Q5_K", np.zeros((1, 176), np.uint8), 256) is None


def test_row_length_is_checked() -> None:
    with pytest.raises(ValueError, match="must be 34 bytes"):
        from_gguf_blocks("Q8_0", np.zeros((1, 30), np.uint8), 32)


@pytest.mark.parametrize("quant,arch,kind", [("Q4_0", "llama", "llama31"),
                                             ("Q8_0", "qwen2", "qwen2")])
def test_kept_quantized_stands_for_the_dequantized_tensors(tmp_path, quant: str, arch: str,
                                                           kind: str) -> None:
    """keep_quantized gives the linear weights as QuantizedWeight (llama.cpp's q/k row order
    undone) whose values are the dequantized load's; the rest is the same tensors."""
    from tessera.formats import open_model
    from tessera.formats.layout import is_linear_weight
    from tessera.hal.quant import QuantizedWeight
    from tests.formats.gguf_helpers import write_gguf
    from tests.worker_proc.helpers import tiny_hf_model

    model = tiny_hf_model(kind, str(tmp_path / "hf"), rope_scaling=None)
    path = str(tmp_path / "q.gguf")
    write_gguf(path, arch, model.config, model.state_dict(), quant=quant)
    files = open_model(path)
    assert files.quantization == f"gguf {quant}"
    dense = dict(files.iter_tensors(torch.float32, progress=False))
    kept = dict(files.iter_tensors(torch.float32, progress=False, keep_quantized=True))
    assert set(kept) == set(dense)
    for name, value in kept.items():
        if is_linear_weight(name):
            assert isinstance(value, QuantizedWeight), name
            assert torch.equal(value.dequantize(), dense[name]), name
        else:
            assert torch.equal(value, dense[name]), name


def test_default_model_is_kept_quantized_exactly() -> None:
    from tessera.formats import open_model
    from tessera.hal.quant import QuantizedWeight

    files = open_model("default")
    names = [n for n in files.tensor_names() if n.endswith(("q_proj.weight", "down_proj.weight"))]
    for name in names[:4]:
        kept = files._load_quantized(name)
        assert isinstance(kept, QuantizedWeight) and kept.scheme == "int4"
        assert torch.equal(kept.dequantize(), files._load(name, torch.float32)), name
