"""The Mixture-of-Experts part of a model config: how many experts, how tokens are routed to
them, shared experts, and which layers stay dense. Each MoE family spells these differently in
config.json; `moe_from_hf` normalizes them, `moe_to_hf` writes them back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tessera.formats.errors import ModelFormatError

# How a family names its experts in config.json and in its checkpoints.
MOE_STYLES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek")


@dataclass(frozen=True)
class MoEConfig:
    """Routing: scores = softmax(router logits) or sigmoid(router logits); with num_groups > 1
    (DeepSeek), experts are split into groups, the topk_groups best groups (by the sum of
    their two best biased scores) are kept and the top_k experts are chosen among them by the
    scores plus `score_correction_bias`; the weights are the chosen (unbiased) scores,
    renormalized to sum 1 if norm_topk_prob, times routed_scaling_factor."""

    style: str  # one of MOE_STYLES
    num_experts: int
    top_k: int
    intermediate_size: int  # of each routed expert
    scoring: str = "softmax"  # softmax | sigmoid
    norm_topk_prob: bool = True
    num_groups: int = 1
    topk_groups: int = 1
    routed_scaling_factor: float = 1.0
    score_correction_bias: bool = False
    shared_intermediate_size: int = 0  # the shared expert(s) fused into one MLP; 0: none
    shared_expert_gate: bool = False  # Qwen2-MoE: sigmoid(x . g) scales the shared expert
    dense_layers: tuple[int, ...] = ()  # layers whose MLP is an ordinary dense one

    def __post_init__(self) -> None:
        if self.style not in MOE_STYLES:
            raise ModelFormatError(f"unknown MoE style {self.style!r}")
        if not 0 < self.top_k <= self.num_experts:
            raise ModelFormatError(f"model config: num_experts_per_tok ({self.top_k}) must be "
                                   f"in 1..num_experts ({self.num_experts})")
        if self.intermediate_size <= 0:
            raise ModelFormatError("model config: the expert intermediate size must be positive")
        if self.scoring not in ("softmax", "sigmoid"):
            raise ModelFormatError(f"model config: MoE scoring {self.scoring!r} is not supported "
                                   f"(softmax, sigmoid)")
        if self.num_experts % self.num_groups or not 0 < self.topk_groups <= self.num_groups:
            raise ModelFormatError(f"model config: {self.num_experts} experts cannot form "
                                   f"n_group={self.num_groups} groups of which "
                                   f"topk_group={self.topk_groups} are kept")
        if self.num_groups > 1 and self.num_experts // self.num_groups < 2:
            raise ModelFormatError("model config: grouped routing needs at least 2 experts "
                                   "per group")

    def is_moe_layer(self, layer: int) -> bool:
        return layer not in self.dense_layers


def _first(data: dict[str, Any], *keys: str) -> Any:
    return next((data[k] for k in keys if data.get(k) is not None), None)


def moe_from_hf(style: str, data: dict[str, Any], num_layers: int) -> MoEConfig:
    experts = _first(data, "num_experts", "num_local_experts", "n_routed_experts")
    if experts is None or data.get("num_experts_per_tok") is None:
        raise ModelFormatError(f"a {style} config.json needs the number of experts and "
                               f"num_experts_per_tok")
    common: dict[str, Any] = dict(style=style, num_experts=int(experts),
                                  top_k=int(data["num_experts_per_tok"]))
    if style == "mixtral":
        return MoEConfig(**common, intermediate_size=int(data["intermediate_size"]))
    inter = int(data["moe_intermediate_size"])
    norm = bool(data.get("norm_topk_prob", style == "deepseek"))
    if style == "deepseek":
        shared = int(data.get("n_shared_experts") or 0) * inter
        first_dense = int(data.get("first_k_dense_replace") or 0)
        return MoEConfig(**common, intermediate_size=inter, scoring="sigmoid",
                         norm_topk_prob=norm, num_groups=int(data.get("n_group") or 1),
                         topk_groups=int(data.get("topk_group") or 1),
                         routed_scaling_factor=float(data.get("routed_scaling_factor", 1.0)),
                         score_correction_bias=True, shared_intermediate_size=shared,
                         dense_layers=tuple(range(min(first_dense, num_layers))))
    # Qwen2-MoE / Qwen3-MoE: layer i is sparse unless listed in mlp_only_layers or off the
    # decoder_sparse_step grid.
    step = int(data.get("decoder_sparse_step") or 1)
    only_dense = {int(i) for i in data.get("mlp_only_layers") or []}
    dense = tuple(i for i in range(num_layers) if i in only_dense or (i + 1) % step)
    shared = int(data.get("shared_expert_intermediate_size") or 0) \
        if style == "qwen2_moe" else 0
    return MoEConfig(**common, intermediate_size=inter, norm_topk_prob=norm,
                     shared_intermediate_size=shared, shared_expert_gate=shared > 0,
                     dense_layers=dense)


def moe_to_hf(moe: MoEConfig, num_layers: int) -> dict[str, Any]:
    out: dict[str, Any] = {"num_experts_per_tok": moe.top_k}
    if moe.style == "mixtral":
        out.update(num_local_experts=moe.num_experts, intermediate_size=moe.intermediate_size)
        return out
    out.update(moe_intermediate_size=moe.intermediate_size, norm_topk_prob=moe.norm_topk_prob)
    if moe.style == "deepseek":
        first = len(moe.dense_layers)
        if moe.dense_layers != tuple(range(first)):
            raise ValueError("DeepSeek-style configs keep only the first layers dense")
        out.update(n_routed_experts=moe.num_experts, n_group=moe.num_groups,
                   topk_group=moe.topk_groups, routed_scaling_factor=moe.routed_scaling_factor,
                   n_shared_experts=moe.shared_intermediate_size // moe.intermediate_size,
                   first_k_dense_replace=first)
        return out
    out.update(num_experts=moe.num_experts, decoder_sparse_step=1,
               mlp_only_layers=list(moe.dense_layers))
    if moe.style == "qwen2_moe":
        out["shared_expert_intermediate_size"] = moe.shared_intermediate_size
    return out
