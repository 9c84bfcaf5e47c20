"""ModelConfig: the one normalized description of a Llama-family model, whatever file it came
from (a Hugging Face config.json, GGUF metadata, a benchmark config)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tessera.formats.errors import ModelFormatError, UnsupportedModelError

# model_type -> (qkv bias by default, q/k norm). Mistral and Llama share one implementation.
SUPPORTED_ARCHS: dict[str, tuple[bool, bool]] = {
    "llama": (False, False),
    "mistral": (False, False),
    "qwen2": (True, False),
    "qwen3": (False, True),
}
_HF_ARCH_NAMES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # one of SUPPORTED_ARCHS
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    # HF rope scaling dict ({"rope_type": "llama3", "factor": ...}); None for plain RoPE.
    rope_scaling: dict[str, Any] | None = field(default=None, compare=True, hash=False)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # The dtype the weights are stored in: informational, not part of the model's identity.
    source_dtype: str = field(default="float32", compare=False)

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise UnsupportedModelError(
                f"model architecture {self.arch!r} is not supported; tessera serves "
                f"{', '.join(sorted(SUPPORTED_ARCHS))} models")
        positive = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                    "intermediate_size", "vocab_size", "max_position_embeddings")
        for name in positive:
            if int(getattr(self, name)) <= 0:
                raise ModelFormatError(f"model config: {name} must be positive, got "
                                       f"{getattr(self, name)!r}")
        if self.num_heads % self.num_kv_heads:
            raise ModelFormatError(f"model config: num_attention_heads ({self.num_heads}) must "
                                   f"be a multiple of num_key_value_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ModelFormatError(f"model config: head_dim must be even for RoPE, got "
                                   f"{self.head_dim}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Normalize a Hugging Face config.json (transformers 4.x or 5.x layout)."""
        arch = data.get("model_type")
        if arch is None:
            names = data.get("architectures") or []
            arch = next((k for k, v in _HF_ARCH_NAMES.items() if v in names), None)
        if arch not in SUPPORTED_ARCHS:
            raise UnsupportedModelError(
                f"model_type {arch!r} (architectures {data.get('architectures')}) is not "
                f"supported; tessera serves {', '.join(sorted(SUPPORTED_ARCHS))} models")
        try:
            hidden = int(data["hidden_size"])
            heads = int(data["num_attention_heads"])
            layers = int(data["num_hidden_layers"])
            inter = int(data["intermediate_size"])
            vocab = int(data["vocab_size"])
        except KeyError as exc:
            raise ModelFormatError(f"config.json lacks the required key {exc.args[0]!r}") from None
        default_bias, qk_norm = SUPPORTED_ARCHS[arch]
        # transformers 5 folds rope_theta and the scaling dict into rope_parameters.
        params = dict(data.get("rope_parameters") or {})
        theta = data.get("rope_theta") or params.pop("rope_theta", None) or 10000.0
        scaling = data.get("rope_scaling") or params or None
        if scaling is not None:
            scaling = dict(scaling)
            scaling.pop("rope_theta", None)
            kind = scaling.get("rope_type", scaling.get("type", "default"))
            scaling = None if kind == "default" else scaling
        eos = data.get("eos_token_id")
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos])
                        if e is not None)
        head_dim = data.get("head_dim") or hidden // heads
        return cls(
            arch=arch,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(data.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            intermediate_size=inter,
            vocab_size=vocab,
            rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position_embeddings=int(data.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
            qkv_bias=bool(data.get("attention_bias", default_bias)),
            qk_norm=qk_norm,
            rope_scaling=scaling,
            bos_token_id=data.get("bos_token_id"),
            eos_token_ids=eos_ids,
            source_dtype=str(data.get("torch_dtype") or data.get("dtype") or "float32"),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json that transformers reads back as the same model (used by tests and by
        anyone who wants to check tessera against transformers)."""
        out: dict[str, Any] = {
            "architectures": [_HF_ARCH_NAMES[self.arch]],
            "model_type": self.arch,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) != 1
            else self.eos_token_ids[0],
        }
        if self.arch != "qwen2":
            out["attention_bias"] = self.qkv_bias
        return out
