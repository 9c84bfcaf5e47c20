"""Phi-3: a Llama decoder (sliding window on every layer when the config sets one) whose
checkpoints store q/k/v as one `qkv_proj` and gate/up as one `gate_up_proj`. Each fused
checkpoint tensor is cut back into the parts the fused layers already take, as it loads, so
the tensor-parallel split stays per part (query heads, KV heads, gate, up)."""

from __future__ import annotations

from tessera.worker_proc.models.layers import Target, Targets
from tessera.worker_proc.models.llama import LlamaForCausalLM
from tessera.worker_proc.models.registry import register


def fuse_targets(targets: Targets, fused: str, parts: list[tuple[str, int]]) -> None:
    """Move the targets of checkpoint tensors `parts` (name, rows) under the one tensor
    `fused` that stacks them in that order, each narrowed to its rows."""
    start = 0
    for name, rows in parts:
        for target in targets.pop(name):
            targets.setdefault(fused, []).append(
                Target(target.module, target.param, target.part, (0, start, rows)))
        start += rows


@register("phi3")
class Phi3ForCausalLM(LlamaForCausalLM):
    def layer_targets(self) -> Targets:
        c = self.config
        out = super().layer_targets()
        for i in self.stage.layers:
            a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
            fuse_targets(out, a + "qkv_proj.weight", [(a + "q_proj.weight", c.q_size),
                                                       (a + "k_proj.weight", c.kv_size),
                                                       (a + "v_proj.weight", c.kv_size)])
            fuse_targets(out, m + "gate_up_proj.weight",
                         [(m + "gate_proj.weight", c.intermediate_size),
                          (m + "up_proj.weight", c.intermediate_size)])
        return out
