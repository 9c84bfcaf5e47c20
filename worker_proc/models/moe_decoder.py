"""Llama-style decoders whose MLPs are Mixture-of-Experts blocks: Mixtral, Qwen2-MoE (a
gated shared expert), Qwen3-MoE (q/k norm), and dots.llm1 (DeepSeek-V3 routing: grouped
sigmoid scores with a correction bias, shared experts, first layers dense, on Qwen3
attention). What differs between them is routing and naming, which `config.moe` carries
(formats/config_moe.py, formats/layout.py); the block is `layers/moe.py`.
"""

from __future__ import annotations

from torch import nn

from tessera.formats.layout import moe_names
from tessera.worker_proc.models.layers.mlp import GatedMLP
from tessera.worker_proc.models.layers.moe import SparseMoEBlock
from tessera.worker_proc.models.llama import LlamaForCausalLM
from tessera.worker_proc.models.registry import register


@register("mixtral", "qwen2_moe", "qwen3_moe", "dots1")
class MoEForCausalLM(LlamaForCausalLM):
    def make_mlp(self, index: int) -> tuple[nn.Module, str]:
        c, moe = self.config, self.config.moe
        assert moe is not None
        if not moe.is_moe_layer(index):
            return GatedMLP(self.ctx, c.hidden_size, c.intermediate_size,
                            activation=c.hidden_act), "mlp."
        return SparseMoEBlock(self.ctx, moe, c.hidden_size, activation=c.hidden_act), \
            moe_names(moe)[0] + "."
