"""A GGUF file (llama.cpp): config from its metadata, tensors dequantized and renamed to the
Hugging Face layout, and the raw metadata (tokenizer vocabulary, merges, chat template)."""

from __future__ import annotations

import os
import re
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from tessera.formats.config import ModelConfig
from tessera.formats.errors import ModelFormatError, UnsupportedModelError
from tessera.formats.layout import is_linear_weight
from tessera.formats.model_files import ModelFiles

if TYPE_CHECKING:
    import torch

    from tessera.hal.quant.weight import QuantizedWeight

# GGUF general.architecture -> our arch. llama.cpp converts Mistral as "llama".
_ARCHS = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(.+)$")


def gguf_to_hf_name(name: str) -> str | None:
    """The HF name of a GGUF tensor, or None for tensors the HF layout has no place for."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _BLOCK_RE.match(name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}"
    return None


def unpermute_qk(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's convert_hf_to_gguf `permute` of q/k rows (its rope pairs adjacent
    dims, HF's rotate-half pairs dim i with i + D/2). Works for weights [out, in] and biases."""
    rows = weight.shape[0]
    return (weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def permute_qk(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's permutation (the inverse of unpermute_qk); tests use it to write GGUFs."""
    rows = weight.shape[0]
    return (weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def _field_value(field: Any) -> Any:
    try:
        return field.contents()
    except Exception:  # a type gguf's reader cannot render: keep the raw parts
        return None


def _f32_float(value: Any) -> float:
    """GGUF stores floats as float32: 1e-5 reads back as 9.9999997e-06. Take the shortest
    decimal that rounds to the same float32, which is what the source config said."""
    for digits in range(1, 10):
        candidate = float(f"{float(value):.{digits}g}")
        if np.float32(candidate) == np.float32(value):
            return candidate
    return float(value)


def read_gguf_metadata(path: str) -> dict[str, Any]:
    """Every key/value of a GGUF file as plain Python values (lists for arrays, str for
    strings). The tokenizer reads tokenizer.ggml.* and tokenizer.chat_template from this."""
    return GGUFFiles(path).gguf_metadata  # type: ignore[return-value]


class GGUFFiles(ModelFiles):
    kind = "gguf"

    def __init__(self, path: str) -> None:
        import gguf

        self.path = path  # set early: error messages below name it
        if not os.path.isfile(path):
            raise ModelFormatError(f"GGUF file {path} does not exist")
        try:
            self._reader = gguf.GGUFReader(path, "r")
        except Exception as exc:
            raise ModelFormatError(f"{path} is not a readable GGUF file: {exc}") from None
        self._tensors = {t.name: t for t in self._reader.tensors}
        self._hf_to_gguf: dict[str, str] = {}
        for name in self._tensors:
            hf = gguf_to_hf_name(name)
            if hf is not None:
                self._hf_to_gguf[hf] = name
        super().__init__(path, self._read_config())

    def _meta(self, key: str, default: Any = None) -> Any:
        field = self._reader.fields.get(key)
        return default if field is None else _field_value(field)

    def _read_config(self) -> ModelConfig:
        garch = self._meta("general.architecture")
        if garch not in _ARCHS:
            raise UnsupportedModelError(
                f"{self.path}: GGUF architecture {garch!r} is not supported; tessera serves "
                f"{', '.join(sorted(_ARCHS))} GGUF files")
        arch = _ARCHS[garch]

        def need(key: str) -> Any:
            value = self._meta(f"{garch}.{key}")
            if value is None:
                raise ModelFormatError(f"{self.path}: GGUF metadata lacks {garch}.{key}")
            return value

        hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
        vocab = self._meta(f"{garch}.vocab_size")
        if vocab is None:
            tokens = self._reader.fields.get("tokenizer.ggml.tokens")
            vocab = len(tokens.data) if tokens is not None else \
                self._tensors["token_embd.weight"].shape[-1]
        head_dim = self._meta(f"{garch}.attention.key_length") or hidden // heads
        scaling = None
        kind = self._meta(f"{garch}.rope.scaling.type")
        if kind not in (None, "none"):
            scaling = {"rope_type": kind,
                       "factor": float(self._meta(f"{garch}.rope.scaling.factor", 1.0))}
            orig = self._meta(f"{garch}.rope.scaling.original_context_length")
            if orig:
                scaling["original_max_position_embeddings"] = int(orig)
        if "rope_freqs.weight" in self._tensors:
            scaling = self._llama3_scaling(int(head_dim), _f32_float(
                self._meta(f"{garch}.rope.freq_base", 10000.0)))
        eos = self._meta("tokenizer.ggml.eos_token_id")
        return ModelConfig(
            arch=arch,
            hidden_size=hidden,
            num_layers=int(need("block_count")),
            num_heads=heads,
            num_kv_heads=int(self._meta(f"{garch}.attention.head_count_kv") or heads),
            head_dim=int(head_dim),
            intermediate_size=int(need("feed_forward_length")),
            vocab_size=int(vocab),
            rms_norm_eps=_f32_float(need("attention.layer_norm_rms_epsilon")),
            rope_theta=_f32_float(self._meta(f"{garch}.rope.freq_base", 10000.0)),
            max_position_embeddings=int(self._meta(f"{garch}.context_length", 4096)),
            tie_word_embeddings="output.weight" not in self._tensors,
            qkv_bias="blk.0.attn_q.bias" in self._tensors,
            qk_norm="blk.0.attn_q_norm.weight" in self._tensors,
            rope_scaling=scaling,
            bos_token_id=self._meta("tokenizer.ggml.bos_token_id"),
            eos_token_ids=() if eos is None else (int(eos),),
            source_dtype="gguf",
        )

    def _llama3_scaling(self, head_dim: int, theta: float) -> dict[str, Any]:
        """Llama 3.x GGUFs bake rope scaling into a rope_freqs tensor (inv_freq divisors) and
        drop its parameters. Recover them: `factor` is the largest divisor; the band limits
        and original context are Meta's (the same for Llama 3.1, 3.2 and 3.3), checked by
        recomputing the divisors."""
        import torch

        from tessera.hal.rope import inv_freq

        tensor = self._tensors["rope_freqs.weight"]
        factors = torch.from_numpy(np.array(tensor.data, dtype=np.float32).reshape(-1))
        scaling = {"rope_type": "llama3", "factor": float(factors.max()),
                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}
        if factors.shape[0] == head_dim // 2:
            want = inv_freq(head_dim, theta) / inv_freq(head_dim, theta, scaling)
            if torch.allclose(factors, want, rtol=1e-4):
                return scaling
        raise UnsupportedModelError(
            f"{self.path}: its rope_freqs tensor does not match Llama 3 rope scaling with "
            f"factor {scaling['factor']}, low/high frequency factors 1/4 and original context "
            f"8192; serve the Hugging Face safetensors folder instead")

    def tensor_names(self) -> list[str]:
        return list(self._hf_to_gguf)

    def _load(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        import torch
        from gguf.quants import dequantize

        tensor = self._tensors[self._hf_to_gguf[name]]
        try:
            data = dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError:
            raise UnsupportedModelError(
                f"{self.path}: tensor {tensor.name} uses quantisation type "
                f"{tensor.tensor_type.name}, which tessera cannot dequantize; use a GGUF "
                f"with Q4_0/Q4_1/Q5_x/Q8_0/Kquants/F16/F32 tensors") from None
        shape = tuple(int(s) for s in reversed(tensor.shape))  # GGUF lists dims fastest first
        out = torch.from_numpy(np.array(data, dtype=np.float32).reshape(shape))
        heads = self._qk_heads(name)
        if heads is not None:
            out = unpermute_qk(out, heads)
        return out.to(dtype)

    def _load_quantized(self, name: str) -> QuantizedWeight | None:
        """A linear weight in its runtime scheme, straight from its blocks (formats/
        gguf_quant.py); None for float tensors and block types without a scheme."""
        from tessera.formats.gguf_quant import from_gguf_blocks

        if not is_linear_weight(name):
            return None
        tensor = self._tensors[self._hf_to_gguf[name]]
        rows, in_features = (int(s) for s in reversed(tensor.shape))
        weight = from_gguf_blocks(tensor.tensor_type.name, np.asarray(tensor.data), in_features)
        if weight is None:
            return None
        if weight.out_features != rows:
            raise ModelFormatError(f"{self.path}: tensor {tensor.name} holds "
                                   f"{weight.out_features} rows, its shape says {rows}")
        heads = self._qk_heads(name)
        if heads is not None:
            import torch

            order = unpermute_qk(torch.arange(rows), heads)
            weight = weight.index_rows(order)
        return weight

    def _qk_heads(self, name: str) -> int | None:
        """llama.cpp permutes q/k rows only for its "llama" rope layout; Qwen uses NeoX (HF)
        order. The heads to undo it over, or None."""
        if self.config.arch != "llama":
            return None
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            return self.config.num_heads
        if name.endswith(("k_proj.weight", "k_proj.bias")):
            return self.config.num_kv_heads
        return None

    def _block_kinds(self) -> list[str]:
        """The GGUF types with a runtime scheme among the linear weights."""
        from tessera.formats.gguf_quant import CONVERTERS

        return sorted({self._tensors[g].tensor_type.name for hf, g in self._hf_to_gguf.items()
                       if is_linear_weight(hf)} & set(CONVERTERS))

    @property
    def quantization(self) -> str | None:
        kinds = self._block_kinds()
        return f"gguf {', '.join(kinds)}" if kinds else None

    def quant_schemes(self) -> set[str]:
        from tessera.formats.gguf_quant import SCHEME_OF

        return {SCHEME_OF[kind] for kind in self._block_kinds()}

    @cached_property
    def _metadata(self) -> dict[str, Any]:
        return {key: _field_value(field) for key, field in self._reader.fields.items()
                if not key.startswith("GGUF.")}

    @property
    def gguf_metadata(self) -> dict[str, Any]:
        return self._metadata

