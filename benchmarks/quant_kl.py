"""Accuracy of a quantization scheme: the mean KL divergence of next-token distributions from
the reference (bf16, or the float model on the cpu plugin) over a fixed prompt set, with the
same weights (dummy weights of the same seed, or the same checkpoint).

The models run in this process, one after the other, through the worker's ModelRunner (the
same code the engine runs, eagerly); each prompt's distribution after its last token is
compared: KL(reference || scheme), in nats, averaged over the prompts.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class KLResult:
    mean_kl: float
    max_kl: float
    top1_agreement: float  # fraction of prompts whose argmax token is the reference's
    prompts: int


def prompt_set(vocab_size: int, count: int = 32, seed: int = 0,
               lengths: tuple[int, int] = (16, 256)) -> list[list[int]]:
    """`count` prompts of lengths spread over `lengths`, random tokens (fixed by the seed)."""
    rng = np.random.default_rng(seed)
    sizes = np.linspace(lengths[0], lengths[1], count).astype(int)
    return [rng.integers(3, vocab_size, size=int(n)).tolist() for n in sizes]


def prefill_batch(prompts: list[list[int]], page_size: int, rows: int, width: int
                  ) -> tuple[Any, np.ndarray]:
    """A ForwardBatch prefilling every prompt whole (greedy, one logits row per prompt) and
    the page table it reads: prompt i in row i, pages handed out in order after page 0."""
    from tessera.bus.messages import ForwardBatch

    table = np.zeros((rows, width), dtype=np.int32)
    next_slot = page_size  # page 0 is the padding page
    for i, p in enumerate(prompts):
        n = -(-len(p) // page_size) * page_size
        table[i, :n] = np.arange(next_slot, next_slot + n)
        next_slot += n
    b = len(prompts)
    lens = np.asarray([len(p) for p in prompts], np.int32)
    zeros_f, ones_f = np.zeros(b, np.float32), np.ones(b, np.float32)
    batch = ForwardBatch(
        step=0, rows=np.arange(b, dtype=np.int32), seq_lens=lens, extend_lens=lens,
        input_ids=np.concatenate([np.asarray(p, np.int32) for p in prompts]),
        sample=np.ones(b, np.uint8), output_lens=np.zeros(b, np.int32), temperature=zeros_f,
        top_p=ones_f, top_k=np.full(b, -1, np.int32), min_p=zeros_f,
        repetition_penalty=ones_f, frequency_penalty=zeros_f, presence_penalty=zeros_f,
        seeds=np.full(b, -1, np.int64), logprobs=np.full(b, -1, np.int32),
        block_offsets=np.zeros(b + 1, np.int32), hist_offsets=np.zeros(b + 1, np.int32))
    return batch, table


def next_token_logits(engine_kwargs: dict[str, Any], prompts: list[list[int]]) -> Any:
    """float32 logits [len(prompts), V] on the host, from a ModelRunner built from the engine
    flags (graphs off: one eager forward), which is then freed."""
    import torch

    from tessera.config import EngineConfig
    from tessera.hal.registry import load_platform
    from tessera.worker_proc.forward_inputs import build_forward_inputs
    from tessera.worker_proc.model_runner import ModelRunner

    longest = max(len(p) for p in prompts)
    page = int(engine_kwargs.get("page_size", 16))
    tokens = sum(-(-len(p) // page) * page for p in prompts) + page
    config = EngineConfig(**{**engine_kwargs, "disable_graph_capture": True,
                             "max_running_requests": max(len(prompts), 1),
                             "context_length": longest + page, "max_total_tokens": tokens})
    platform = load_platform(config.hal)
    runner = ModelRunner(config, 0, platform)
    try:
        batch, table = prefill_batch(prompts, runner.kv_plan.page_size,
                                     config.max_running_requests, runner.max_context_len)
        with torch.inference_mode():
            logits = runner.forward(build_forward_inputs(batch, table, platform, runner.device))
            return logits.float().cpu()
    finally:
        del runner
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def kl_divergence(reference: Any, other: Any) -> KLResult:
    """KL(reference || other) per row of two [B, V] logits tensors."""
    import torch

    ref = torch.log_softmax(reference.double(), dim=-1)
    got = torch.log_softmax(other.double(), dim=-1)
    kl = (ref.exp() * (ref - got)).sum(dim=-1)
    agree = (reference.argmax(-1) == other.argmax(-1)).double().mean()
    return KLResult(float(kl.mean()), float(kl.max()), float(agree), int(kl.shape[0]))
