"""A Hugging Face folder of real size written from a config: config.json, a word-level
tokenizer.json of the config's vocabulary, and random weights in safetensors shards. B10 starts
the engine from it to measure loading real files (read from disk, not drawn at random).

`copying=True` writes a model of the same shape and cost that repeats its last input token:
every attention and MLP output projection is zero (the residual stream stays the token's
embedding) and the LM head is the embedding table, whose row for the token scores highest (in
4096 dimensions a random row's product with itself dwarfs its products with the others). B9
measures speculation on it where random weights never repeat themselves: every weight is
still read each step, so a step costs what the real shape costs."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

SHARD_BYTES = 5 << 30  # what Hugging Face's save_pretrained uses


@dataclass(frozen=True)
class WrittenFolder:
    path: str
    bytes: int
    shards: int
    seconds: float


def hf_config_dict(config_path: str) -> dict[str, Any]:
    with open(config_path, encoding="utf-8") as f:
        data = json.load(f)
    return data["hf_config"] if isinstance(data.get("hf_config"), dict) else data


def weights_bytes(config_path: str, dtype_bytes: int = 2) -> int:
    from tessera.formats.config import ModelConfig
    from tessera.formats.layout import hf_tensor_shapes

    shapes = hf_tensor_shapes(ModelConfig.from_hf_dict(hf_config_dict(config_path)))
    total = 0
    for shape in shapes.values():
        n = 1
        for d in shape:
            n *= int(d)
        total += n * dtype_bytes
    return total


def write_tokenizer(folder: str, vocab_size: int) -> None:
    """A word-level tokenizer of `vocab_size` tokens ("t0 t1 ..." reads as ids 0, 1, ...)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(os.path.join(folder, "tokenizer.json"))


def write_folder(config_path: str, folder: str, device: str = "cpu", seed: int = 0,
                 copying: bool = False) -> WrittenFolder:
    """Write the folder; values are drawn on `device` (a GPU draws 16 GB in a second)."""
    import time

    import torch
    from safetensors.torch import save_file

    from tessera.formats.config import ModelConfig
    from tessera.formats.layout import hf_tensor_shapes, is_norm_weight

    start = time.perf_counter()
    hf = hf_config_dict(config_path)
    shapes = hf_tensor_shapes(ModelConfig.from_hf_dict(hf))
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump({**hf, "torch_dtype": "bfloat16"}, f, indent=1)
    write_tokenizer(folder, int(hf["vocab_size"]))
    gen = torch.Generator(device=device).manual_seed(seed)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    total = 0
    weight_map: dict[str, str] = {}
    names = list(shapes)
    embedding: torch.Tensor | None = None

    def flush(last: bool) -> None:
        index = len(shards)
        name = f"model-{index:05d}.safetensors"
        save_file({k: v.cpu() for k, v in shards[-1].items()}, os.path.join(folder, name),
                  metadata={"format": "pt"})
        for k in shards[-1]:
            weight_map[k] = name
        if not last:
            shards.append({})

    for i, name in enumerate(names):
        shape = tuple(int(d) for d in shapes[name])
        if is_norm_weight(name):
            t = torch.ones(shape, dtype=torch.bfloat16, device=device)
        elif copying and name.endswith(("o_proj.weight", "down_proj.weight")):
            t = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        elif copying and name == "lm_head.weight":
            assert embedding is not None, "the embedding comes before the LM head"
            t = embedding.clone()
        else:
            t = (torch.randn(shape, generator=gen, device=device) * 0.02).to(torch.bfloat16)
        if name == "model.embed_tokens.weight":
            embedding = t
        nbytes = t.numel() * 2
        if size and size + nbytes > SHARD_BYTES:
            flush(last=False)
            size = 0
        shards[-1][name] = t
        size += nbytes
        total += nbytes
        if i == len(names) - 1:
            flush(last=True)
    with open(os.path.join(folder, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    return WrittenFolder(folder, total, len(shards), time.perf_counter() - start)
