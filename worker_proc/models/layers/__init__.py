"""The layers every model is built from. Each owns its parameters (built on the meta device,
materialized as checkpoint tensors stream in), knows which checkpoint tensors it takes
(`targets(prefix)`) and calls the HAL op table for its math."""

from tessera.worker_proc.models.layers.attention import Attention
from tessera.worker_proc.models.layers.embedding import LMHead, VocabEmbedding
from tessera.worker_proc.models.layers.linear import (
    DenseLinear,
    Linear,
    LinearMethod,
    OutputPart,
    qkv_parts,
    split_parts,
)
from tessera.worker_proc.models.layers.mlp import GatedMLP
from tessera.worker_proc.models.layers.norm import RMSNorm
from tessera.worker_proc.models.layers.params import Target, Targets, add_target
from tessera.worker_proc.models.layers.rotary import RotaryEmbedding

__all__ = [
    "Attention",
    "DenseLinear",
    "GatedMLP",
    "LMHead",
    "Linear",
    "LinearMethod",
    "OutputPart",
    "RMSNorm",
    "RotaryEmbedding",
    "Target",
    "Targets",
    "VocabEmbedding",
    "add_target",
    "qkv_parts",
    "split_parts",
]
