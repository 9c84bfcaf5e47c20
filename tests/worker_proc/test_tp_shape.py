"""TPShape: how a model is split across ranks, Mixture-of-Experts layers included."""

from __future__ import annotations

import pytest

from tessera.formats.config import ModelConfig
from tessera.worker_proc.tp import TPShape

BASE = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
        "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 100}
QWEN3_MOE = {**BASE, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
             "moe_intermediate_size": 32}


def test_expert_groups_and_expert_sharding():
    mc = ModelConfig.from_hf_dict(QWEN3_MOE)
    # tp 4, ep 2: ranks 0-1 hold experts 0-3, ranks 2-3 experts 4-7, each half of I
    shapes = [TPShape.of(mc, r, 4, ep_size=2) for r in range(4)]
    assert [(s.ep_rank, s.moe_tp_rank, s.moe_tp_size) for s in shapes] == \
        [(0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2)]
    whole = TPShape.of(mc, 3, 4, ep_size=4)
    assert (whole.ep_rank, whole.moe_tp_size) == (3, 1)


def test_sizes_that_do_not_divide_are_refused():
    mc = ModelConfig.from_hf_dict(QWEN3_MOE)
    with pytest.raises(ValueError, match="must divide --tp-size"):
        TPShape.of(mc, 0, 4, ep_size=3)
    with pytest.raises(ValueError, match=r"number of experts \(12\) by ep 8"):
        TPShape.of(ModelConfig.from_hf_dict({**QWEN3_MOE, "num_attention_heads": 8,
                                              "num_key_value_heads": 8, "num_experts": 12}),
                   0, 8, ep_size=8)
    with pytest.raises(ValueError, match="expert intermediate size"):
        TPShape.of(ModelConfig.from_hf_dict({**QWEN3_MOE, "moe_intermediate_size": 30}), 0, 4)
    dense = ModelConfig.from_hf_dict({**BASE, "model_type": "llama"})
    with pytest.raises(ValueError, match="needs a Mixture-of-Experts model"):
        TPShape.of(dense, 0, 2, ep_size=2)
