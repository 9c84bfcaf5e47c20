"""Which --tp-size / --pp-size splits a model allows, what an impossible one says (the flag to
change and the sizes that work), and how the layers fall into pipeline stages."""

from __future__ import annotations

import pytest

from tessera.formats.config import ModelConfig
from tessera.formats.parallel import (
    StageLayers,
    devices_problem,
    pp_problem,
    split_problems,
    tp_problem,
    tp_sizes_that_work,
)


def llama(**overrides: object) -> ModelConfig:
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
          "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
          "intermediate_size": 1536, "vocab_size": 49152, "rms_norm_eps": 1e-5,
          "max_position_embeddings": 2048, **overrides}
    return ModelConfig.from_hf_dict(hf)


def test_split_that_divides_is_accepted() -> None:
    config = llama()
    assert split_problems(config, tp_size=3, pp_size=2) == []
    assert tp_sizes_that_work(config) == [1, 3]
    # more ranks than KV heads: each KV head is replicated on tp / kv ranks
    assert tp_problem(llama(num_attention_heads=8, num_key_value_heads=2,
                            intermediate_size=1024), 8) is None


def test_impossible_split_names_the_flag_and_what_works() -> None:
    config = llama()
    msg = tp_problem(config, 2)
    assert msg is not None and msg.startswith("--tp-size 2 does not divide")
    assert "num_attention_heads (9)" in msg and "num_key_value_heads (3)" in msg
    assert msg.endswith("choose a --tp-size that divides them: 1, 3")
    msg = pp_problem(config, 4)
    assert msg is not None and "--pp-size 4 does not divide num_hidden_layers (30)" in msg
    assert msg.endswith("1, 2, 3, 5, 6, 10, 15, 30")
    assert split_problems(config, 2, 4) == [tp_problem(config, 2), pp_problem(config, 4)]
    assert "--pp-size must be at least 1" in str(pp_problem(config, 0))


def test_more_ranks_than_devices_is_refused() -> None:
    assert devices_problem(2, 2, 1, devices=2, plugin="x") is None
    msg = devices_problem(4, 2, 2, devices=2, plugin="x")
    assert msg is not None and "--tp-size 2 x --pp-size 2 = 4 worker ranks" in msg
    assert "sees 2 device(s)" in msg and "lower --tp-size or --pp-size" in msg


def test_stages_split_the_layers_in_order() -> None:
    stages = [StageLayers.of(30, 3, s) for s in range(3)]
    assert [s.layers for s in stages] == [range(0, 10), range(10, 20), range(20, 30)]
    assert stages[0].is_first and not stages[0].is_last and stages[2].is_last
    assert 19 in stages[1] and 20 not in stages[1]
    with pytest.raises(ValueError, match="--pp-size 4"):
        StageLayers.of(30, 4, 0)
