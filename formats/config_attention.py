"""The attention details of a config.json beyond heads and sizes: rotary parameters (global and
per layer type), which layers use a sliding window, soft-capping, scales. Each family spells
them its own way; these functions normalize them for ModelConfig."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# model_type -> how its sliding window is laid out when config.json has no layer_types:
#   "all":      every layer, when sliding_window is set (Mistral, Mixtral, Phi-3)
#   "qwen":     layers >= max_window_layers, only with use_sliding_window
#   "qwen_moe": every layer, only with use_sliding_window (Qwen3-MoE)
#   "qwen2_moe": odd-numbered layers below max_window_layers, with use_sliding_window
#   "gemma2":   every other layer (0, 2, 4, ...)
#   "gemma3":   all but every sliding_window_pattern-th layer
#   "none":     no sliding window
WINDOW_LAYOUTS = {"mistral": "all", "mixtral": "all", "phi3": "all", "qwen2": "qwen",
                  "qwen3": "qwen", "dots1": "qwen", "qwen3_moe": "qwen_moe",
                  "qwen2_moe": "qwen2_moe", "gemma2": "gemma2", "gemma3_text": "gemma3"}


# transformers' class defaults where config.json may omit the key (it is null when off)
_WINDOW_DEFAULTS = {"mistral": 4096, "gemma2": 4096, "gemma3_text": 4096}


@dataclass(frozen=True)
class RopeParams:
    theta: float
    scaling: dict[str, Any] | None
    local_theta: float  # rope base of sliding-window layers (Gemma 3); 0: the same as theta


def rope_params(data: dict[str, Any]) -> RopeParams:
    """transformers 4 keeps rope_theta / rope_scaling (/ rope_local_base_freq); transformers 5
    folds them into rope_parameters, per layer type for Gemma 3."""
    params = dict(data.get("rope_parameters") or {})
    local = 0.0
    if isinstance(params.get("full_attention"), dict):  # per layer type
        local_params = params.get("sliding_attention") or {}
        local = float(local_params.get("rope_theta") or 0.0)
        params = dict(params["full_attention"])
    local = float(data.get("rope_local_base_freq") or local)
    theta = data.get("rope_theta") or params.pop("rope_theta", None) or 10000.0
    scaling = data.get("rope_scaling") or params or None
    if scaling is not None:
        scaling = dict(scaling)
        scaling.pop("rope_theta", None)
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        scaling = None if kind == "default" else scaling
    return RopeParams(float(theta), scaling, local if local != float(theta) else 0.0)


def sliding_layers(arch: str, data: dict[str, Any], num_layers: int) -> tuple[int, tuple[int, ...]]:
    """(window, the layers that use it); (0, ()) when there is no sliding window."""
    window = int(data.get("sliding_window", _WINDOW_DEFAULTS.get(arch)) or 0)
    layout = WINDOW_LAYOUTS.get(arch, "none")
    if layout in ("qwen", "qwen_moe", "qwen2_moe") and not data.get("use_sliding_window"):
        window = 0
    if window <= 0 or layout == "none":
        return 0, ()
    types = data.get("layer_types")
    if types:
        return window, tuple(i for i, t in enumerate(types[:num_layers])
                             if t == "sliding_attention")
    if layout == "qwen":
        first = int(data.get("max_window_layers") or 0)
        return window, tuple(range(first, num_layers))
    if layout == "qwen2_moe":
        below = int(data.get("max_window_layers") or num_layers)
        return window, tuple(i for i in range(min(below, num_layers)) if (i + 1) % 2)
    if layout == "gemma2":
        return window, tuple(i for i in range(num_layers) if (i + 1) % 2)
    if layout == "gemma3":
        pattern = int(data.get("sliding_window_pattern") or data.get("_sliding_window_pattern")
                      or 6)
        return window, tuple(i for i in range(num_layers) if (i + 1) % pattern)
    return window, tuple(range(num_layers))
