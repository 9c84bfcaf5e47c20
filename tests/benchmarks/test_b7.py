"""B7 sends B4's prompts as text (the router routes on text): through the dummy model's
vocabulary the text is exactly the prompt's ids again, so prefixes shared in ids are shared in
text and the hit rates measure the same workload as B4."""

from __future__ import annotations

import json

from tessera.benchmarks.b7 import dummy_text
from tessera.benchmarks.datasets import shared_prefix_requests
from tessera.benchmarks.dummy_model import resolve_dummy_model

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 1024,
        "bos_token_id": 1, "eos_token_id": 2}


def test_dummy_text_tokenizes_back_to_the_ids(tmp_path) -> None:
    from tokenizers import Tokenizer

    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY))
    folder = resolve_dummy_model(str(config), "dummy")
    tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
    for req in shared_prefix_requests(2, 3, 40, 6, 4, 512, seed=1):
        ids = tokenizer.encode(dummy_text(req.prompt_ids), add_special_tokens=False).ids
        assert ids == req.prompt_ids
