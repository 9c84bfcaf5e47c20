"""ModelConfig: the one normalized description of a model, whatever file it came from (a
Hugging Face config.json, GGUF metadata, a benchmark config)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tessera.formats.config_attention import rope_params, sliding_layers
from tessera.formats.config_moe import MoEConfig, moe_from_hf, moe_to_hf
from tessera.formats.errors import ModelFormatError, UnsupportedModelError


@dataclass(frozen=True)
class ArchTraits:
    """What a model_type implies that its config.json does not always say."""

    hf_class: str  # transformers' class name (`architectures` in config.json)
    qkv_bias: bool = False  # default when config.json has no attention_bias
    qk_norm: bool = False
    moe_style: str | None = None  # formats/config_moe.py; None: a dense model
    tie_word_embeddings: bool = False  # default when config.json does not say
    hidden_act: str = "silu"  # default activation (config.json's hidden_act wins)
    # Gemma: norms scale by (1 + w), extra norms after attention and MLP, sqrt(hidden)
    # embedding scale
    gemma_norms: bool = False
    fused_checkpoint: bool = False  # q/k/v and gate/up stored fused (Phi-3)


# model_type -> traits: the model types formats can normalize. Each has an implementation
# registered under the same name in worker_proc/models.
SUPPORTED_ARCHS: dict[str, ArchTraits] = {
    "llama": ArchTraits("LlamaForCausalLM"),
    "mistral": ArchTraits("MistralForCausalLM"),
    "qwen2": ArchTraits("Qwen2ForCausalLM", qkv_bias=True),
    "qwen3": ArchTraits("Qwen3ForCausalLM", qk_norm=True),
    "mixtral": ArchTraits("MixtralForCausalLM", moe_style="mixtral"),
    "qwen2_moe": ArchTraits("Qwen2MoeForCausalLM", qkv_bias=True, moe_style="qwen2_moe"),
    "qwen3_moe": ArchTraits("Qwen3MoeForCausalLM", qk_norm=True, moe_style="qwen3_moe"),
    # DeepSeek-V3 routing (sigmoid, grouped, shared experts) on Qwen3 attention.
    "dots1": ArchTraits("Dots1ForCausalLM", qk_norm=True, moe_style="deepseek"),
    "gemma2": ArchTraits("Gemma2ForCausalLM", tie_word_embeddings=True,
                         hidden_act="gelu_tanh", gemma_norms=True),
    "gemma3_text": ArchTraits("Gemma3ForCausalLM", qk_norm=True, tie_word_embeddings=True,
                              hidden_act="gelu_tanh", gemma_norms=True),
    "phi3": ArchTraits("Phi3ForCausalLM", fused_checkpoint=True),
    # Llama with multipliers on the embeddings, residual branches, attention and logits.
    "granite": ArchTraits("GraniteForCausalLM"),
}
# transformers' Gemma 3 defaults, which hub configs rely on: their text_config often lists only
# what differs (the rope bases only where rope_parameters is absent)
_GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "bos_token_id": 2, "eos_token_id": 1,
}
# multimodal model_type -> the text model inside it (served text-only: the vision tower's
# tensors are skipped, formats/hf_folder.py)
MULTIMODAL_TEXT_MODELS = {"gemma3": "gemma3_text"}


def text_model_dict(data: dict[str, Any]) -> dict[str, Any]:
    """The config of the language model: a multimodal config's text_config (with the
    top-level token ids where it has none), or the config itself."""
    arch = data.get("model_type")
    if arch in MULTIMODAL_TEXT_MODELS and isinstance(data.get("text_config"), dict):
        text = dict(data["text_config"])
        for key in ("bos_token_id", "eos_token_id", "tie_word_embeddings"):
            if key not in text and key in data:
                text[key] = data[key]
        text["model_type"] = MULTIMODAL_TEXT_MODELS[arch]
        data = text
    if data.get("model_type") == "gemma3_text":
        data = {**_GEMMA3_TEXT_DEFAULTS, **data}
        if not data.get("rope_parameters"):
            data.setdefault("rope_theta", 1_000_000.0)
            data.setdefault("rope_local_base_freq", 10_000.0)
    return data


# config.json's hidden_act / hidden_activation -> the activation the MLP ops implement
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_tanh": "gelu_tanh"}


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
    moe: MoEConfig | None = None  # Mixture-of-Experts layers; None: every MLP is dense
    hidden_act: str = "silu"  # silu | gelu_tanh, the MLP's gate activation
    rotary_dim: int = 0  # dims of each head that rotate (partial rotary); 0: all of them
    sliding_window: int = 0  # 0: none; else layers in sliding_layers see the last this many
    sliding_layers: tuple[int, ...] = ()
    local_rope_theta: float = 0.0  # rope base of the sliding layers if it differs (Gemma 3)
    attn_logit_softcap: float = 0.0  # Gemma 2; 0: none
    final_logit_softcap: float = 0.0
    attn_scale: float = 0.0  # the attention's score scale; 0: head_dim ** -0.5
    embedding_scale: float = 1.0  # embeddings are multiplied by it (Gemma, Granite)
    residual_scale: float = 1.0  # each residual branch is multiplied by it (Granite)
    logits_scaling: float = 1.0  # logits are divided by it (Granite)

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
        style = SUPPORTED_ARCHS[self.arch].moe_style
        if style != (self.moe.style if self.moe is not None else None):
            raise ModelFormatError(f"model config: a {self.arch} model needs "
                                   f"{'MoE settings of style ' + style if style else 'no MoE'}")
        if self.hidden_act not in ("silu", "gelu_tanh"):
            raise ModelFormatError(f"model config: hidden_act {self.hidden_act!r} is not "
                                   f"silu or gelu_tanh")
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ModelFormatError(f"model config: {self.rotary_dim} rotary dims do not fit "
                                   f"head_dim {self.head_dim} (even, at most head_dim)")
        if any(not 0 <= i < self.num_layers for i in self.sliding_layers):
            raise ModelFormatError("model config: layer_types names more layers than the model "
                                   "has")
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
        data = text_model_dict(data)
        arch = data.get("model_type")
        if arch is None:
            names = data.get("architectures") or []
            arch = next((k for k, v in SUPPORTED_ARCHS.items() if v.hf_class in names), None)
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
        traits = SUPPORTED_ARCHS[arch]
        rope = rope_params(data)
        act_name = data.get("hidden_activation") or data.get("hidden_act") or traits.hidden_act
        if act_name not in _ACTIVATIONS:
            raise UnsupportedModelError(f"activation {act_name!r} is not supported; tessera "
                                        f"runs {', '.join(sorted(_ACTIVATIONS))}")
        window, windowed = sliding_layers(arch, data, layers)
        eos = data.get("eos_token_id")
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos])
                        if e is not None)
        head_dim = int(data.get("head_dim") or hidden // heads)
        partial = float(data.get("partial_rotary_factor") or 1.0)
        extras: dict[str, Any] = {}
        if traits.gemma_norms:
            extras["embedding_scale"] = hidden ** 0.5
            # transformers' class defaults apply where config.json omits a key
            gemma2 = arch == "gemma2"
            extras["attn_scale"] = float(data.get("query_pre_attn_scalar", 256)) ** -0.5
            extras["attn_logit_softcap"] = float(
                data.get("attn_logit_softcapping", 50.0 if gemma2 else None) or 0.0)
            extras["final_logit_softcap"] = float(
                data.get("final_logit_softcapping", 30.0 if gemma2 else None) or 0.0)
        if arch == "granite":
            extras.update(embedding_scale=float(data.get("embedding_multiplier", 1.0)),
                          residual_scale=float(data.get("residual_multiplier", 1.0)),
                          attn_scale=float(data.get("attention_multiplier", 0.0)),
                          logits_scaling=float(data.get("logits_scaling", 1.0)))
        return cls(
            arch=arch,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(data.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            intermediate_size=inter,
            vocab_size=vocab,
            rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
            rope_theta=rope.theta,
            max_position_embeddings=int(data.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(data.get("tie_word_embeddings",
                                              traits.tie_word_embeddings)),
            qkv_bias=bool(data.get("attention_bias", traits.qkv_bias)),
            qk_norm=traits.qk_norm,
            rope_scaling=rope.scaling,
            bos_token_id=data.get("bos_token_id"),
            eos_token_ids=eos_ids,
            source_dtype=str(data.get("torch_dtype") or data.get("dtype") or "float32"),
            moe=None if traits.moe_style is None else moe_from_hf(traits.moe_style, data, layers),
            hidden_act=_ACTIVATIONS[act_name],
            rotary_dim=int(head_dim * partial) if partial < 1.0 else 0,
            sliding_window=window,
            sliding_layers=windowed,
            local_rope_theta=rope.local_theta,
            **extras,
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json that transformers reads back as the same model (used by tests and by
        anyone who wants to check tessera against transformers)."""
        out: dict[str, Any] = {
            "architectures": [SUPPORTED_ARCHS[self.arch].hf_class],
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
            "hidden_act": {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh"}[self.hidden_act],
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) != 1
            else self.eos_token_ids[0],
        }
        if self.arch not in ("qwen2", "qwen2_moe"):
            out["attention_bias"] = self.qkv_bias
        if self.moe is not None:
            out.update(moe_to_hf(self.moe, self.num_layers))
        out.update(self._attention_to_hf())
        return out

    def _attention_to_hf(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sliding_window": self.sliding_window or None}
        if self.sliding_window:
            out["use_sliding_window"] = True
            out["layer_types"] = ["sliding_attention" if i in self.sliding_layers
                                  else "full_attention" for i in range(self.num_layers)]
        if self.rotary_dim:
            out["partial_rotary_factor"] = self.rotary_dim / self.head_dim
        if SUPPORTED_ARCHS[self.arch].gemma_norms:
            out.update(hidden_activation="gelu_pytorch_tanh",
                       query_pre_attn_scalar=self.attn_scale ** -2 if self.attn_scale else None,
                       attn_logit_softcapping=self.attn_logit_softcap or None,
                       final_logit_softcapping=self.final_logit_softcap or None)
            if self.local_rope_theta:
                out["rope_local_base_freq"] = self.local_rope_theta
        if self.arch == "granite":
            out.update(embedding_multiplier=self.embedding_scale,
                       residual_multiplier=self.residual_scale,
                       attention_multiplier=self.attn_scale or self.head_dim ** -0.5,
                       logits_scaling=self.logits_scaling)
        return out
