"""Structured output on the GPU: the grammar runtime with the cuda plugin's sampler and its
apply_token_mask kernel, masks copied from pinned host memory, step n+1 masked before step
n's answer is read, on the byte-level vocabulary of the 8B shape's dummy model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

CONFIG = Path(__file__).parents[2] / "benchmarks" / "configs" / "llama3-8b.json"


def test_constrained_outputs_on_the_gpu(tmp_path: Path) -> None:
    from tessera.benchmarks.dummy_model import dummy_model_dir
    from tessera.formats.tokenizer import load_tokenizer
    from tessera.hal.registry import load_platform
    from tessera.worker_proc.grammar.vocab import tokenizer_info
    from tessera.worker_proc.sampler import Sampler
    from tests.worker_proc.grammar.drive import (
        REGEX,
        follows_schema,
        parse_json,
        ready_runtime,
        run,
    )

    folder = dummy_model_dir(str(CONFIG), root=str(tmp_path), byte_level=True)
    tok = load_tokenizer(folder)
    vocab = json.loads(CONFIG.read_text())["vocab_size"]
    info = tokenizer_info(folder, vocab, tok.eos_token_ids)
    platform = load_platform("cuda")
    device = platform.device(0)
    sampler = Sampler(platform, device, platform.op("apply_token_mask"))
    rt = ready_runtime(info, vocab, platform, device)
    for seed in range(3):
        out, ended = run(rt, sampler, [0, -1, 2, 1], vocab, seed=seed, device=device)
        assert set(ended) == {0, 2, 3}
        texts = {i: tok.decode(out[i][:-1], skip_special_tokens=False) for i in (0, 2, 3)}
        assert all(out[i][-1] in tok.eos_token_ids for i in (0, 2, 3))
        assert re.fullmatch(REGEX, texts[0]) and re.fullmatch(REGEX, texts[3]), texts
        assert follows_schema(parse_json(texts[2])), texts[2]
